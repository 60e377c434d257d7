"""The token counts a fixed-shape step is made for, and the columns of its fixed KV cache.

A captured step (a CUDA graph) has one shape: a forward over n new tokens runs the
step of the smallest bucket that holds n, its spare rows padded. The CPU path and the GPU
path choose buckets and size the cache with these same functions, so CI tests them.
"""

from __future__ import annotations

import bisect

# Each bucket is captured once (a graph and its warm-up, a fraction of a second for a
# 13B model) and keeps its own input and output buffers, so there are few of them; each
# padded row is computed and thrown away, so neighbours are at most 1.5x apart (5 tokens
# run as 6, 33 as 48). Small sizes are dense because decode (1) and short chains (2-4)
# are the common calls. The largest holds the widest verify the methods make: EAGLE-2's
# 60-token tree or Medusa's 63-node tree with the root (64); more goes to the eager path.
BUCKETS: tuple[int, ...] = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
LARGEST = BUCKETS[-1]

# A fixed cache's columns are a multiple of this: a decoding needs a capacity of its own,
# and rounding lets decodings of similar lengths share one storage (and its graphs) while
# attention over the whole capacity reads at most 255 unused columns.
COLUMN_ROUNDING = 256

# The last column of a fixed cache is scratch: padded rows write their keys and values
# there, and no real row ever sees it.
SCRATCH_COLUMNS = 1


def bucket_for(n: int) -> int | None:
    """The smallest bucket that holds ``n`` tokens (n >= 1), or None past the largest."""
    if n < 1:
        raise ValueError(f"a step runs at least one token, not {n}")
    index = bisect.bisect_left(BUCKETS, n)
    return BUCKETS[index] if index < len(BUCKETS) else None


def static_columns(entries: int) -> int:
    """The columns of a fixed cache that holds ``entries`` tokens: those and the scratch
    column, rounded up to ``COLUMN_ROUNDING``."""
    needed = entries + SCRATCH_COLUMNS
    return -(-needed // COLUMN_ROUNDING) * COLUMN_ROUNDING


def decoding_columns(prompt_tokens: int, max_new_tokens: int) -> int:
    """The columns of a fixed cache for one decoding: its prompt, its answer and the
    largest bucket beyond them (the last verify's draft is written before it is cut)."""
    return static_columns(prompt_tokens + max_new_tokens + LARGEST)


# Sequences a fixed cache holds side by side (its lanes), and the lane counts a batched
# step is made for: a batched call runs the lanes up to its highest one's bucket, a lane
# without a token in the call padded. Beyond the largest, the sequence lent its lane
# longest ago moves its entries out and runs eagerly.
LANES: tuple[int, ...] = (1, 2, 4, 8, 16)


def lanes_for(lane: int) -> int:
    """The lanes a step runs when ``lane`` (0-based) is the highest in its call."""
    index = bisect.bisect_left(LANES, lane + 1)
    if index == len(LANES):
        raise ValueError(f"lane {lane} is past the last of {LANES[-1]}")
    return LANES[index]
