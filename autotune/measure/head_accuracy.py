"""How often Medusa heads are right, counted on the target's own greedy decoding.

At every position t of a calibration continuation the heads read the target's hidden
state; head k is right at rank r when its rank-r token is the continuation's token at
t + k + 2. Two tables come out of one pass:

- per-head top-k accuracy, each head over the positions where its answer exists (head k
  has k fewer than head 0: one denominator for all heads would understate the deep ones);
- path accuracy: the probability that a whole path of ranks (r0, ..., rd) is right,
  counted directly (not the product of per-head figures, which assumes independence).
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from dataclasses import dataclass, field

import torch

from autotune.engine.runner import Runner
from autotune.heads.medusa import MedusaHeads


@dataclass
class HeadAccuracy:
    top_k: list[list[float]]  # top_k[head][k - 1]: accuracy within the top k
    positions: list[int]  # per head: positions with an answer
    path_accuracy: dict[tuple[int, ...], float] = field(default_factory=dict)

    @property
    def top1(self) -> list[float]:
        return [row[0] for row in self.top_k]

    def as_dict(self) -> dict:
        return {
            "top_k": self.top_k,
            "positions": self.positions,
            "paths": [[list(p), v] for p, v in self.path_accuracy.items()],
        }

    @classmethod
    def from_dict(cls, data: dict) -> HeadAccuracy:
        return cls(data["top_k"], data["positions"], {tuple(p): v for p, v in data["paths"]})

    @property
    def top5(self) -> list[float]:
        """Within the top 5, or the widest measured when fewer ranks were counted."""
        return [row[min(4, len(row) - 1)] for row in self.top_k]


def rank_among(top: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """The position of each ``truth`` token among its ranked candidates ``top`` [..., K]
    (best first), or -1 when it is not among them."""
    hit = top == truth.unsqueeze(-1)
    return torch.where(hit.any(-1), hit.int().argmax(-1), torch.full_like(truth, -1))


def _ranks(
    heads: MedusaHeads,
    hidden: torch.Tensor,
    num_heads: int,
    max_rank: int,
    truth: list[int],
    chunk: int = 64,
) -> torch.Tensor:
    """[T, heads]: rank of the true token in each head's top ``max_rank``, -1 if absent
    or if the continuation ends before that head's offset."""
    T = hidden.shape[0]
    out = torch.full((T, num_heads), -1, dtype=torch.long)
    truth_t = torch.tensor(truth + [-1] * (num_heads + 2))
    for start in range(0, T, chunk):
        rows = slice(start, min(start + chunk, T))
        logits = heads(hidden[rows], num_heads)  # [heads, t, V]
        top = logits.topk(max_rank, dim=-1).indices  # [heads, t, R]
        for k in range(num_heads):
            offsets = torch.arange(rows.start, rows.stop) + k + 2
            out[rows, k] = rank_among(top[k], truth_t[offsets])
    return out


class RankTally:
    """Counts, over draft positions, the rank of the true token at each depth: per-depth
    top-k hits (each depth over the positions where its answer exists) and whole paths."""

    def __init__(self, depth: int, max_rank: int):
        self.hits = torch.zeros(depth, max_rank)
        self.positions = [0] * depth
        self.paths: Counter = Counter()

    def add(self, ranks: list[int], available: int) -> None:
        """ranks[d]: rank of the true token at depth d + 1 (-1: not in the top max_rank);
        only the first ``available`` depths have a true token."""
        path: tuple[int, ...] = ()
        for d, rank in enumerate(ranks[: max(available, 0)]):
            self.positions[d] += 1
            if rank >= 0:
                self.hits[d, rank] += 1
            if rank < 0 or len(path) < d:
                continue
            path = path + (rank,)
            self.paths[path] += 1

    def accuracy(self) -> HeadAccuracy:
        depth = len(self.positions)
        top_k = [
            (self.hits[d].cumsum(0) / max(self.positions[d], 1)).tolist() for d in range(depth)
        ]
        return HeadAccuracy(
            top_k=top_k,
            positions=list(self.positions),
            path_accuracy={p: n / self.positions[len(p) - 1] for p, n in self.paths.items()},
        )


def calibration_states(runner: Runner, prompt: list[int], continuation: list[int]):
    """The target's hidden states (before its final norm) at every position of prompt +
    continuation but the last, from one forward: what heads are measured on."""
    sequence = prompt + continuation
    cache = runner.new_cache(capacity=len(sequence) + 8, own=True)  # one long forward
    ids = torch.tensor(sequence[:-1], device=runner.device)
    return runner.forward(
        ids, torch.arange(len(ids), device=runner.device), cache, last_only=True
    ).hidden


@torch.inference_mode()
def measure_head_accuracy(
    runner: Runner,
    heads: MedusaHeads,
    calibration: list[tuple[list[int], list[int]]],
    max_rank: int = 10,
    num_heads: int | None = None,
    progress=None,
) -> HeadAccuracy:
    """calibration: (prompt, greedy continuation) pairs."""
    num_heads = heads.num_heads if num_heads is None else num_heads
    tally = RankTally(num_heads, max_rank)
    for prompt, continuation in calibration:
        sequence = prompt + continuation
        states = calibration_states(runner, prompt, continuation)
        first = len(prompt) - 1  # its logits gave continuation[0]
        hidden = runner.norm(states[first:])  # positions first .. len(sequence) - 2
        truth = sequence[first:]  # truth[j + k + 2] answers head k at row j
        ranks = _ranks(heads, hidden, num_heads, max_rank, truth).tolist()
        for j, row in enumerate(ranks):
            tally.add(row, len(truth) - j - 2)
        if progress:
            progress()
    return tally.accuracy()


@torch.inference_mode()
def measure_head_costs(runner: Runner, heads: MedusaHeads, repeats: int = 15) -> list[float]:
    """seconds[d - 1]: median time to evaluate the first d heads on one hidden state and
    take their top tokens (what a draft step of a depth-d tree costs)."""
    hidden = torch.randn(1, heads.hidden_size, dtype=runner.dtype, device=runner.device)
    samples: list[list[float]] = [[] for _ in range(heads.num_heads)]
    for _ in range(repeats + 1):
        for depth in range(1, heads.num_heads + 1):
            start = time.perf_counter()
            heads(runner.norm(hidden), depth).topk(10, dim=-1)
            if runner.device.type == "cuda":
                torch.cuda.synchronize()
            samples[depth - 1].append(time.perf_counter() - start)
    return [statistics.median(s[1:]) for s in samples]
