"""Medusa's typical acceptance for sampling: the (eps, delta) pair with the longest
accepted length whose fidelity to the target's distribution is at least that of Medusa's
own defaults, from real decoding."""

from __future__ import annotations

from autotune.budget import Budget
from autotune.drafters.medusa import MedusaDrafter
from autotune.engine.decoding import decode_speculative, tokens_per_step
from autotune.engine.sampling import SamplingConfig, probabilities
from autotune.engine.verify import TypicalAcceptance
from autotune.methods.medusa.settings import TypicalSettings
from autotune.methods.medusa.space import TypicalSpace
from autotune.progress import step
from autotune.workspace import Workspace

MEDUSA_DEFAULT_TYPICAL = TypicalAcceptance(eps=0.09, delta=0.3)


def typical_statistics(
    ws: Workspace,
    heads,
    tree,
    prompts,
    rule: TypicalAcceptance,
    sampling: SamplingConfig,
    tokens: int,
) -> dict:
    """Tokens per step and fidelity of typical acceptance, decoding for real.

    Fidelity: per emitted token, the overlap sum_x min(q(x), p(x)) between the
    distribution it was drawn from (a point mass for a typical-accepted node, the target
    itself for a bonus token) and the target's; exact speculative sampling scores 1.
    """

    overlap = [0.0]
    emitted = [0]

    def record(draft, path, logits):
        probs = probabilities(logits, sampling)
        parents = [0] + [node + 1 for node in path[:-1]]
        for row, node in zip(parents, path):
            overlap[0] += float(probs[row, draft.tokens[node]])
        overlap[0] += 1.0  # the bonus token is drawn from the target
        emitted[0] += len(path) + 1

    steps = produced = 0
    for prompt in prompts:
        ids = prompt.ids
        result = decode_speculative(
            ws.runner,
            MedusaDrafter(heads, tree),
            ids,
            tokens,
            sampling,
            typical=rule,
            on_verify=record,
        )
        steps += result.steps
        produced += len(result.tokens)
    return {
        "eps": rule.eps,
        "delta": rule.delta,
        "tokens_per_step": round(tokens_per_step(produced, steps, len(prompts)), 4),
        "fidelity": round(overlap[0] / max(emitted[0], 1), 4),
    }


def swept_pairs(space: TypicalSpace) -> list[TypicalAcceptance]:
    """The (eps, delta) pairs a sweep measures, in order: Medusa's own first."""
    pairs = [TypicalAcceptance(e, d) for e, d in space.pairs]
    return [MEDUSA_DEFAULT_TYPICAL] + [p for p in pairs if p != MEDUSA_DEFAULT_TYPICAL]


def tune_typical(
    ws: Workspace, heads, tree, prompts, space: TypicalSpace, until: Budget | None = None
) -> TypicalSettings:
    """Sweep (eps, delta); keep the pair with the longest accepted length whose fidelity
    is at least the floor (by default, that of Medusa's own 0.09 / 0.3). Medusa's own pair
    is measured first; the others only while ``until`` has time (each decodes for real:
    a whole sweep took ~2 minutes on 2 cores)."""
    sampling = SamplingConfig(temperature=space.temperature, seed=0)
    pairs = swept_pairs(space)
    rows: list[dict] = []
    with step("medusa: typical acceptance sweep", len(pairs)) as advance:
        for rule in pairs:
            if rows and until is not None and until.spent():
                break
            rows.append(typical_statistics(ws, heads, tree, prompts, rule, sampling, space.tokens))
            advance()
    medusa = MEDUSA_DEFAULT_TYPICAL
    default = next(r for r in rows if (r["eps"], r["delta"]) == (medusa.eps, medusa.delta))
    floor = space.min_fidelity if space.min_fidelity is not None else default["fidelity"]
    allowed = [r for r in rows if r["fidelity"] >= floor - 1e-9] or [default]
    best = max(allowed, key=lambda r: (r["tokens_per_step"], r["fidelity"]))
    return TypicalSettings(
        eps=best["eps"],
        delta=best["delta"],
        temperature=space.temperature,
        min_fidelity=round(floor, 4),
        sweep=rows,
    )
