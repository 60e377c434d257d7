"""What a batched forward hands its decoder layers: the sequences' segments, and the rows
they make together. Apart from the runner so that both ways of running the layers (the
runner's Python layers and ``engine.stack``'s C++ ones) read them without importing each
other."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from autotune.engine.kvcache import KVCache
from autotune.engine.skip import SkipMask


@dataclass
class Segment:
    """One sequence's part of a batched forward (``Runner.forward_batch``): its tokens [S]
    at their positions [S], its own cache, and its mask as ``Runner.forward`` takes it."""

    tokens: torch.Tensor
    positions: torch.Tensor
    cache: KVCache
    mask: torch.Tensor | None = None
    last_only: bool = False  # logits of its last token only (a prefill)


@dataclass(frozen=True)
class LayerRows:
    """Everything the decoder layers of one batched forward read besides the hidden
    states: the segments' rows lie one after another, ``counts[i]`` rows for
    ``segments[i]``; ``rope``: (cos, sin) [1, S, D] at the tokens' positions; ``skip``:
    the sublayers left out."""

    rope: tuple[torch.Tensor, torch.Tensor]
    segments: list[Segment]
    counts: list[int]
    skip: SkipMask
