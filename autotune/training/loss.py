"""Losses through the target's frozen lm_head: cross-entropy over the vocabulary without
holding every logit, the labels the target itself gives, and the dtype its product runs
in."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from autotune.errors import AutotuneError

IGNORE = -100  # label of a row that has no target (past an answer's end, or in a prompt)
# Logit rows per matrix product with the lm_head: 512 x 49152 floats is ~100 MB.
LOGIT_CHUNK_ROWS = 512


class FrozenProjectionCE(torch.autograd.Function):
    """sum_r row_weight[r] * CE(rows[r] @ weight.T, target[r]), never holding all logits.

    The projection is frozen, so the only gradient needed is the rows': it is computed
    chunk by chunk in the forward pass, (softmax - onehot) @ weight, and kept."""

    @staticmethod
    def forward(ctx, rows, weight, targets, row_weights):
        total = rows.new_zeros(())
        grad = torch.empty_like(rows)
        for start in range(0, rows.shape[0], LOGIT_CHUNK_ROWS):
            part = slice(start, start + LOGIT_CHUNK_ROWS)
            logits = (rows[part].to(weight.dtype) @ weight.T).float()  # [c, V]
            target = targets[part, None]
            lse = logits.logsumexp(-1, keepdim=True)
            w = row_weights[part]
            total += ((lse - logits.gather(1, target))[:, 0] * w).sum()
            probs = logits.sub_(lse).exp_()  # softmax, in place
            probs.scatter_add_(1, target, probs.new_full(target.shape, -1.0))
            probs.mul_(w[:, None])
            grad[part] = (probs.to(weight.dtype) @ weight).to(rows.dtype)
        ctx.save_for_backward(grad)
        return total

    @staticmethod
    def backward(ctx, grad_output):
        (grad,) = ctx.saved_tensors
        return grad * grad_output, None, None, None


@torch.inference_mode()
def greedy_next(states: torch.Tensor, lm_head_weight: torch.Tensor) -> torch.Tensor:
    """[N] the target's greedy next token after each of ``states`` [N, H] (normed last
    hidden states): what it would write there, a label for heads on text it did not write."""
    out = torch.empty(states.shape[0], dtype=torch.long)
    weight = lm_head_weight.detach()
    for start in range(0, states.shape[0], LOGIT_CHUNK_ROWS):
        part = states[start : start + LOGIT_CHUNK_ROWS].to(weight.device, weight.dtype)
        out[start : start + LOGIT_CHUNK_ROWS] = (part @ weight.T).argmax(-1).cpu()
    return out


def loss_dtype(name: str) -> torch.dtype:
    """``auto``: bfloat16 where the CPU has native bfloat16 dot products (AVX512-BF16 or
    AMX). On a 2-core AVX512-BF16 CPU an epoch over SmolLM2's answers took 35 s instead of
    56 s, the heads' gradient was within 0.5% of float32's, and held-back accuracy after an
    epoch was the same. Elsewhere bfloat16 is emulated and slower: float32."""
    if name == "auto":
        return torch.bfloat16 if _cpu_has_bf16() else torch.float32
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16}
    if name not in dtypes:
        raise AutotuneError(f"unknown loss dtype '{name}': use auto, float32 or bfloat16")
    return dtypes[name]


def _cpu_has_bf16() -> bool:
    try:
        with open("/proc/cpuinfo") as stream:
            for line in stream:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return bool(flags & {"avx512_bf16", "amx_bf16"})
    except OSError:
        pass
    return False


@dataclass(frozen=True)
class TrainingVocab:
    """The tokens a head's cross-entropy ranks among while it trains: the labels' most
    frequent. The loss's product with the frozen lm_head dominates a head's training step
    on CPU: over 8192 of SmolLM2's 49152 tokens, Medusa heads trained on about 5x the
    positions per second, and those tokens covered all but a few of 46k labels. Accuracy
    is always measured over the whole vocabulary."""

    ids: torch.Tensor  # [V'] token ids, most frequent first
    slots: torch.Tensor  # [V] each token id's index in ``ids``, IGNORE outside

    @classmethod
    def of(cls, labels: torch.Tensor, vocab_size: int, size: int) -> TrainingVocab:
        """The ``size`` most frequent of ``labels`` (IGNORE skipped); 0: the whole vocabulary."""
        counts = torch.bincount(labels[labels != IGNORE].flatten().cpu(), minlength=vocab_size)
        whole = size <= 0 or size >= vocab_size
        ids = torch.arange(vocab_size) if whole else counts.argsort(descending=True)[:size]
        slots = torch.full((vocab_size,), IGNORE, dtype=torch.long)
        slots[ids] = torch.arange(len(ids))
        return cls(ids, slots)

    def weight(self, lm_head_weight: torch.Tensor) -> torch.Tensor:
        """The lm_head's rows of these tokens, in their order."""
        return lm_head_weight[self.ids.to(lm_head_weight.device)]

    def map(self, labels: torch.Tensor) -> torch.Tensor:
        """Labels as indices into ``ids``: IGNORE stays, a token outside becomes IGNORE."""
        slots = self.slots.to(labels.device)
        return torch.where(labels == IGNORE, labels, slots[labels.clamp(min=0)])
