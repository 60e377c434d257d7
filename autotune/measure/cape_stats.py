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
    def collect(cls, confidences, ranks, bins: int = 20, max_rank: int = MAX_RANK
                ) -> "ConfidenceRanks":
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
        return slice(int(round(low * self.bins)), int(round(high * self.bins)))

    def merged(self, other: "ConfidenceRanks") -> "ConfidenceRanks":
        return ConfidenceRanks(self.counts + other.counts)

    def as_dict(self) -> dict:
        return {"counts": self.counts.tolist()}

    @classmethod
    def from_dict(cls, data: dict) -> "ConfidenceRanks":
        return cls(np.asarray(data["counts"], dtype=np.int64))


def self_spec_confidence_ranks(traces: list[DraftTrace], bins: int = 20) -> ConfidenceRanks:
    """From the layer-skip draft's teacher-forced traces (each position drafted from the
    exact context, as the first step of a proposal is)."""
    confidences = np.concatenate([t.confidences for t in traces])
    ranks = np.concatenate([t.ranks for t in traces])
    return ConfidenceRanks.collect(confidences, ranks, bins)


@torch.inference_mode()
def eagle_confidence_ranks(runner: Runner, head: EagleHead,
                           calibration: list[tuple[list[int], list[int]]], depth: int,
                           projection: DraftProjection | None = None,
                           bins: int = 20) -> ConfidenceRanks:
    """From the head's own extrapolation along the greedy path, every step that a chain
    of top-1 tokens reaches."""
    confidences, ranks = [], []
    for prompt, continuation in calibration:
        features = runner.norm(calibration_states(runner, prompt, continuation))
        rank, confidence = extrapolation_ranks(head, runner, features, prompt + continuation,
                                               len(prompt) - 1, depth, MAX_RANK, projection,
                                               with_confidence=True)
        available = torch.arange(len(rank) - 1, -1, -1)[:, None] - torch.arange(depth)[None]
        exists = available > 0                       # the step's true token is in the text
        previous_right = torch.ones_like(rank, dtype=torch.bool)
        previous_right[:, 1:] = (rank[:, :-1] == 0).cumprod(1).bool()
        counted = exists & previous_right
        confidences.append(confidence[counted].numpy())
        ranks.append(rank[counted].numpy())
    return ConfidenceRanks.collect(np.concatenate(confidences), np.concatenate(ranks), bins)
