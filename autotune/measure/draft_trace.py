"""Teacher-forced draft statistics for a skip mask, along the target's own greedy path.

For every position of a calibration continuation, the skipped-layer draft predicts the
next token from the exact context (the full model's cached keys/values), as it would
when drafting the first token of a step. One draft forward per sequence covers all
positions: each query sees the cached prefix before it and its own draft key/value.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from autotune.engine.kvcache import KVCache
from autotune.engine.runner import Runner
from autotune.engine.skip import SkipMask
from autotune.measure.head_accuracy import rank_among

MAX_RANK = 10  # ranks counted in traces: CAPE expands by at most this many tokens a step


@dataclass
class DraftTrace:
    matches: np.ndarray  # [C] bool: draft's top-1 == target's greedy token
    confidences: np.ndarray  # [C] draft's top-1 probability
    ranks: np.ndarray | None = None  # [C] rank of the target's token, -1 past MAX_RANK


@dataclass
class _Sequence:
    tokens: torch.Tensor  # prompt + continuation[:-1]: the inputs
    targets: torch.Tensor  # continuation: the target's greedy next tokens
    start: int  # first input position whose next token is in the continuation
    cache: KVCache


class DraftTracer:
    def __init__(self, runner: Runner, sequences: list[tuple[list[int], list[int]]]):
        """sequences: (prompt ids, target greedy continuation) pairs."""
        self.runner = runner
        self._sequences = []
        for prompt, continuation in sequences:
            tokens = torch.tensor(prompt + continuation[:-1], device=runner.device)
            # kept for every mask the search tries: storage of its own, not a lane
            cache = runner.new_cache(capacity=2 * len(tokens) + 8, own=True)
            runner.forward(
                tokens, torch.arange(len(tokens), device=runner.device), cache, last_only=True
            )
            self._sequences.append(
                _Sequence(
                    tokens, torch.tensor(continuation, device=runner.device), len(prompt) - 1, cache
                )
            )

    @torch.inference_mode()
    def traces(self, skip: SkipMask) -> list[DraftTrace]:
        return [self._trace(seq, skip) for seq in self._sequences]

    def _trace(self, seq: _Sequence, skip: SkipMask) -> DraftTrace:
        total = len(seq.tokens)
        positions = torch.arange(seq.start, total, device=self.runner.device)
        count = len(positions)
        sees_prefix = torch.arange(total, device=self.runner.device)[None, :] < positions[:, None]
        sees_self = torch.eye(count, dtype=torch.bool, device=self.runner.device)
        mask = torch.cat([sees_prefix, sees_self], dim=1)
        seq.cache.crop(total)
        logits = self.runner.forward(
            seq.tokens[seq.start :], positions, seq.cache, mask=mask, skip=skip
        ).logits
        seq.cache.crop(total)
        probs = torch.softmax(logits, dim=-1)
        top = probs.topk(MAX_RANK, dim=-1)
        ranks = rank_among(top.indices, seq.targets)
        return DraftTrace(
            matches=(top.indices[:, 0] == seq.targets).cpu().numpy(),
            confidences=top.values[:, 0].cpu().numpy(),
            ranks=ranks.cpu().numpy(),
        )
