"""What confidence-aware expansion is fitted on: for each draft confidence (the draft's
top-1 probability at a step), how the rank of the target's token in the draft's
distribution is spread, counted on calibration decoding along the target's greedy path.

Only steps the draft's own chain reaches count: a step whose earlier chain tokens were
all right (the chain goes on past a wrong token only in drafts that are rejected there).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from autotune.engine.runner import Runner
from autotune.heads.eagle import DraftProjection, EagleHead
from autotune.measure.draft_trace import MAX_RANK, DraftTrace
from autotune.measure.eagle_accuracy import extrapolation_ranks
from autotune.measure.head_accuracy import calibration_states


@dataclass
class ConfidenceRanks:
    """counts[b, r]: steps with confidence in fine bin b (of equal width over (0, 1]) whose
    target token had rank r (r < max_rank); counts[b, max_rank]: ranked further down."""

    counts: np.ndarray

    @classmethod
    def collect(
        cls, confidences, ranks, bins: int = 20, max_rank: int = MAX_RANK
    ) -> ConfidenceRanks:
        confidences = np.asarray(confidences, dtype=float)
        ranks = np.asarray(ranks, dtype=int)
        fine = np.clip(np.ceil(confidences * bins).astype(int) - 1, 0, bins - 1)
        column = np.where((ranks >= 0) & (ranks < max_rank), ranks, max_rank)
        counts = np.zeros((bins, max_rank + 1), dtype=np.int64)
        np.add.at(counts, (fine, column), 1)
        return cls(counts)

    @property
    def bins(self) -> int:
        return self.counts.shape[0]

    @property
    def max_rank(self) -> int:
        return self.counts.shape[1] - 1

    def steps(self, low: float, high: float) -> int:
        return int(self.counts[self._rows(low, high)].sum())

    def rank_distribution(self, low: float, high: float) -> np.ndarray:
        """[max_rank + 1]: the probability of each rank (the last: further down) for steps
        with confidence in (low, high]; low and high fall on the fine bins' edges."""
        total = self.counts[self._rows(low, high)].sum(0)
        return total / max(int(total.sum()), 1)

    def _rows(self, low: float, high: float) -> slice:
        return slice(round(low * self.bins), round(high * self.bins))

    def merged(self, other: ConfidenceRanks) -> ConfidenceRanks:
        return ConfidenceRanks(self.counts + other.counts)

    def as_dict(self) -> dict:
        return {"counts": self.counts.tolist()}

    @classmethod
    def from_dict(cls, data: dict) -> ConfidenceRanks:
        return cls(np.asarray(data["counts"], dtype=np.int64))


@dataclass
class ChainSteps:
    """A chain drafter along one calibration continuation of R tokens. Row t: drafting
    once continuation[:t] is committed, step j predicts continuation[t + j], drafted as it
    is when steps 0 .. j - 1 were right. confidences[t, j]: the draft's top-1 probability
    there; ranks[t, j]: the rank of the target's token, -1 if not within the top MAX_RANK
    or past the end (t + j >= R). Row 0 is never drafted: the prefill gives
    continuation[0]."""

    confidences: np.ndarray  # [R, D]
    ranks: np.ndarray  # [R, D]

    @property
    def roots(self) -> int:
        return len(self.ranks)

    @property
    def depth(self) -> int:
        return self.ranks.shape[1]

    def reached(self) -> np.ndarray:
        """[R, D] bool: steps that decoding drafts, that exist and that a chain of top-1
        tokens gets to."""
        exists = (np.arange(self.roots)[:, None] + np.arange(self.depth)[None]) < self.roots
        exists[0] = False
        before_right = np.ones_like(exists)
        before_right[:, 1:] = np.cumprod(self.ranks[:, :-1] == 0, axis=1).astype(bool)
        return exists & before_right


def self_spec_chain_steps(trace: DraftTrace, depth: int) -> ChainSteps:
    """The layer-skip draft's step j from root t is its teacher-forced prediction at t + j:
    both see the exact context when steps before j were right."""
    if trace.ranks is None:
        raise ValueError("the trace holds no ranks: trace with ranks to fit CAPE on it")
    count = len(trace.confidences)
    index = np.arange(count)[:, None] + np.arange(depth)[None]
    inside = index < count
    index = np.minimum(index, count - 1)
    return ChainSteps(
        np.where(inside, trace.confidences[index], 0.0), np.where(inside, trace.ranks[index], -1)
    )


@torch.inference_mode()
def eagle_chain_steps(
    runner: Runner,
    head: EagleHead,
    calibration: list[tuple[list[int], list[int]]],
    depth: int,
    projection: DraftProjection | None = None,
    progress=None,
) -> list[ChainSteps]:
    """The head's own extrapolation along each greedy continuation: what its chain drafts
    at every root and step while the steps before were right."""
    chains = []
    for prompt, continuation in calibration:
        features = runner.norm(calibration_states(runner, prompt, continuation))
        ranks, confidences = extrapolation_ranks(
            head,
            runner,
            features,
            prompt + continuation,
            len(prompt) - 1,
            depth,
            MAX_RANK,
            projection,
            with_confidence=True,
        )
        # extrapolation root i has committed continuation[i]: it is row i + 1; row 0 (the
        # prefill's) is not drafted
        chains.append(
            ChainSteps(
                np.concatenate([np.zeros((1, depth)), confidences.numpy()[:-1]]),
                np.concatenate([np.full((1, depth), -1), ranks.numpy()[:-1]]),
            )
        )
        if progress:
            progress()
    return chains


def self_spec_confidence_ranks(traces: list[DraftTrace], bins: int = 20) -> ConfidenceRanks:
    """From the layer-skip draft's teacher-forced traces (each position drafted from the
    exact context, as the first step of a proposal is)."""
    confidences = np.concatenate([t.confidences for t in traces])
    ranks = np.concatenate([t.ranks for t in traces])
    return ConfidenceRanks.collect(confidences, ranks, bins)


def chain_confidence_ranks(chains: list[ChainSteps], bins: int = 20) -> ConfidenceRanks:
    """Every step that a chain of top-1 tokens reaches."""
    reached = [c.reached() for c in chains]
    return ConfidenceRanks.collect(
        np.concatenate([c.confidences[r] for c, r in zip(chains, reached)]),
        np.concatenate([c.ranks[r] for c, r in zip(chains, reached)]),
        bins,
    )
