"""Expected speed of chain drafting, replayed on measured draft traces. Pure functions.

Costs are in units of one single-token target forward, so the estimate is directly a
speedup over plain greedy decoding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from autotune.engine.decoding import tokens_per_step
from autotune.measure.costs import LatencyCurve
from autotune.measure.draft_trace import DraftTrace


@dataclass(frozen=True)
class ChainEstimate:
    speedup: float
    tokens_per_step: float
    max_tokens: int
    exit_threshold: float


def replay(
    traces: Sequence[DraftTrace],
    max_tokens: int,
    exit_threshold: float,
    draft_ratio: float,
    verify_relative: Sequence[float],
) -> ChainEstimate:
    """Replay a static draft-exit policy along each trace.

    draft_ratio: cost of one draft forward; verify_relative[n - 1]: cost of verifying
    n tokens (the input token plus n - 1 drafted).
    """
    verify = LatencyCurve(list(verify_relative))
    tokens = steps = 0
    cost = 0.0
    for trace in traces:
        length = len(trace.matches)
        t = 0
        while t < length:
            drafted, forwards = 1, 1
            while drafted < max_tokens and t + drafted < length:
                forwards += 1
                if trace.confidences[t + drafted] < exit_threshold:
                    break
                drafted += 1
            accepted = 0
            while accepted < drafted and trace.matches[t + accepted]:
                accepted += 1
            produced = min(accepted + 1, length - t)
            tokens += produced
            steps += 1
            cost += forwards * draft_ratio + verify(drafted + 1)
            t += produced
    speedup = tokens / cost if cost else 0.0
    # the traces hold no prefill token: every token counted came from a step
    return ChainEstimate(
        speedup, tokens_per_step(tokens, steps, sequences=0), max_tokens, exit_threshold
    )


def best_static_policy(
    traces: Sequence[DraftTrace],
    draft_ratio: float,
    verify_relative: Sequence[float],
    max_tokens_choices: Sequence[int],
    threshold_choices: Sequence[float],
) -> ChainEstimate:
    """The fastest (max_tokens, exit_threshold) pair on the grid."""
    estimates = [
        replay(traces, max_tokens, threshold, draft_ratio, verify_relative)
        for max_tokens in max_tokens_choices
        for threshold in (threshold_choices if max_tokens > 1 else [0.0])
    ]
    # the first of equals wins, as the grid is ordered
    return max(estimates, key=lambda e: e.speedup)
