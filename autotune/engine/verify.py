"""Acceptance rules for a drafted chain; pure functions, no model calls.

Words used here: the *accepted* tokens are the draft tokens the target keeps; the *bonus*
token is the one the target itself supplies after them (its correction at the first
rejected position, or its next token when every draft token was accepted).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from autotune.engine.sampling import sample
from autotune.engine.tree import TreeShape


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


def accept_sampled(
    draft_tokens: list[int],
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator,
) -> tuple[int, int]:
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
        return i, sample(dist, generator)
    last = len(draft_tokens)
    return last, sample(target_probs[last], generator)


# Trees: row 0 of the target's logits/probabilities is the root (the last committed
# token), row i + 1 is draft node i. A path is the list of accepted node indices.


def accept_tree_greedy(
    tokens: list[int], tree: TreeShape, target_logits: torch.Tensor
) -> tuple[list[int], int]:
    """Follow the target's argmax down the tree; lossless. Returns (path, bonus)."""
    wanted = target_logits.argmax(dim=-1).tolist()
    path: list[int] = []
    row = 0
    while True:
        child = next((c for c in tree.children[row] if tokens[c] == wanted[row]), None)
        if child is None:
            return path, wanted[row]
        path.append(child)
        row = child + 1


def accept_tree_sampled(
    tokens: list[int],
    tree: TreeShape,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: torch.Generator,
) -> tuple[list[int], int]:
    """Multi-round speculative sampling: the output follows ``target_probs`` exactly.

    At each accepted node its children are tried in order; a rejected child's draft
    distribution is taken out of the target's (the residual) before the next one is
    tried. ``draft_probs`` [N, V] are the distributions the nodes were drawn from; None
    means the nodes were chosen deterministically (top-k), a point mass at the token.
    """
    path: list[int] = []
    row = 0
    while True:
        p = target_probs[row]
        for child in tree.children[row]:
            token = tokens[child]
            q_token = 1.0 if draft_probs is None else float(draft_probs[child, token])
            if q_token > 0 and torch.rand((), generator=generator) < p[token] / q_token:
                path.append(child)
                row = child + 1
                break
            if draft_probs is None:
                residual = p.clone()
                residual[token] = 0.0
            else:
                residual = (p - draft_probs[child]).clamp_min(0.0)
            total = residual.sum()
            # zero residual: the draft covered the target entirely; keep the target's own
            p = residual / total if total > 0 else p
        else:
            return path, sample(p, generator)


@dataclass(frozen=True)
class TypicalAcceptance:
    """Medusa's typical acceptance: a node is accepted when the target gives its token
    probability above min(eps, delta * exp(-entropy)). Not lossless: it trades fidelity
    to the target's distribution for longer accepted paths (Medusa's defaults)."""

    eps: float = 0.09
    delta: float = 0.3


def accept_tree_typical(
    tokens: list[int],
    tree: TreeShape,
    target_probs: torch.Tensor,
    rule: TypicalAcceptance,
    generator: torch.Generator,
) -> tuple[list[int], int]:
    """The longest path of typical-accepted nodes (first in node order on ties); the
    bonus is drawn from the target at the end of it."""
    entropy = -(target_probs * target_probs.clamp_min(1e-12).log()).sum(dim=-1)
    threshold = torch.minimum(torch.full_like(entropy, rule.eps), rule.delta * (-entropy).exp())
    token_ids = torch.tensor(tokens, dtype=torch.long, device=target_probs.device)
    parent_rows = torch.tensor(
        [p + 1 for p in tree.parents], dtype=torch.long, device=target_probs.device
    )
    ok = (target_probs[parent_rows, token_ids] > threshold[parent_rows]).tolist()
    best: list[int] = []
    stack: list[tuple[int, list[int]]] = [(0, [])]
    while stack:
        row, path = stack.pop()
        if len(path) > len(best):
            best = path
        for child in reversed(tree.children[row]):
            if ok[child]:
                stack.append((child + 1, path + [child]))
    last_row = best[-1] + 1 if best else 0
    return best, sample(target_probs[last_row], generator)
