"""Acceptance rules for a drafted chain; pure functions, no model calls.

Words used here: the *accepted* tokens are the draft tokens the target keeps; the *bonus*
token is the one the target itself supplies after them (its correction at the first
rejected position, or its next token when every draft token was accepted).
"""
from __future__ import annotations

import torch


def accept_greedy(draft_tokens: list[int], target_logits: torch.Tensor) -> tuple[int, int]:
    """target_logits[i] is the target's prediction after draft token i-1 (row 0: after
    the input token). Returns (number accepted, bonus token)."""
    target_tokens = target_logits.argmax(dim=-1).tolist()
    accepted = 0
    for drafted, wanted in zip(draft_tokens, target_tokens):
        if drafted != wanted:
            break
        accepted += 1
    return accepted, target_tokens[accepted]


def accept_sampled(draft_tokens: list[int], draft_probs: torch.Tensor,
                   target_probs: torch.Tensor, generator: torch.Generator) -> tuple[int, int]:
    """Speculative sampling: the output follows ``target_probs`` exactly.

    draft_probs [k, V] are the distributions the draft tokens were drawn from;
    target_probs [k + 1, V] the target's at the same positions plus one.
    """
    for i, token in enumerate(draft_tokens):
        ratio = target_probs[i, token] / draft_probs[i, token]
        if torch.rand((), generator=generator) < ratio:
            continue
        residual = (target_probs[i] - draft_probs[i]).clamp_min(0.0)
        total = residual.sum()
        # a zero residual means the two distributions agree; then the target's own is exact
        dist = residual / total if total > 0 else target_probs[i]
        return i, int(torch.multinomial(dist, 1, generator=generator))
    last = len(draft_tokens)
    return last, int(torch.multinomial(target_probs[last], 1, generator=generator))
