"""Tuning GLIDE on the search split: how long a draft runs (draft length, exit threshold)
and over which draft vocabulary.

1. Calibration: along greedy continuations of search prompts the draft never trained on,
   its chain at every root and step from the target's cache as it stands there
   (``measure.glide_accuracy``), and the measured cost of a drafting step per vocabulary.
2. Prediction: every (vocabulary, length, threshold) of a grid replayed on paper with
   those steps, the step cost and this device's verify-latency curve
   (``tuners.cape_fit.replay`` without expansion: the layer-skip exit rule is GLIDE's).
3. A measured study (wall clock, search prompts the calibration did not use), started
   from the best predictions and the reference's setting (4 tokens, no exit); the best
   measured trial is kept, the best prediction when no trial finished in time.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from autotune.drafters.cape import NO_EXPANSION
from autotune.drafters.self_spec import DraftExitPolicy
from autotune.measure.cape_stats import ChainSteps
from autotune.measure.costs import LatencyCurve
from autotune.measure.glide_accuracy import (
    chain_acceptance,
    chain_top1,
    glide_chain_steps,
    measure_step_seconds,
)
from autotune.measure.timing import EncodedPrompt
from autotune.methods import registry
from autotune.methods.base import TuneContext
from autotune.methods.glide.settings import GlideSettings
from autotune.methods.glide.space import GlideSpace
from autotune.methods.glide.trials import (
    GlideObjective,
    load_draft_for,
    policy_of,
    projection_for,
    vocab_sizes,
)
from autotune.methods.heads import confirm_and_calibration, heads_id, unseen_search_prompts
from autotune.methods.studies import completed, run_method_study
from autotune.progress import say, step
from autotune.tuners.cape_fit import SelfSpecChain, replay


@dataclass
class Calibrated:
    """What the study is steered by."""

    vocabs: list[int]
    chains: dict[int, list[ChainSteps]]  # draft-vocabulary size -> chains
    step_seconds: dict[int, float]  # draft-vocabulary size -> one drafting step
    confirm: list[EncodedPrompt]  # search prompts the trials decode
    calibration_prompts: int


def tune(ctx: TuneContext) -> GlideSettings:
    head_dir = str(ctx.heads)
    space: GlideSpace = ctx.space
    calibrated = calibrate(ctx, head_dir)
    curve = ctx.workspace.verify_curve(space.calibration.max_depth + 1)
    predicted = predict(space, calibrated, curve)
    say(
        f"glide: best predicted {predicted[0]['max_tokens']} tokens, exit "
        f"{predicted[0]['exit_threshold']}, draft vocabulary {predicted[0]['vocab'] or 'all'}: "
        f"{predicted[0]['predicted_speedup']:.3f}x"
    )
    study = draft_study(ctx, head_dir, calibrated, predicted)
    params = winner(ctx, study, calibrated, predicted)
    trials = [
        {**t.params, "speedup": round(t.value, 4)}
        for t in sorted(completed(study), key=lambda t: t.value, reverse=True)
    ]
    return GlideSettings.of(
        head_dir,
        policy_of(params),
        draft_vocab=int(params["vocab"]),
        study=study.study_name,
        search={
            "draft_vocab": {
                str(v): {
                    "top1_by_step": [round(a, 4) for a in chain_top1(calibrated.chains[v])],
                    "chain_accepted_by_length": [
                        round(a, 4) for a in chain_acceptance(calibrated.chains[v])
                    ],
                    "step_seconds": round(calibrated.step_seconds[v], 6),
                }
                for v in calibrated.vocabs
            },
            **ctx.workspace.verify_record(curve),
            "predicted_top": predicted[:6],
            "trials": trials,
            "calibration_prompts": calibrated.calibration_prompts,
            "seconds": round(ctx.budget.elapsed(), 1),
        },
    )


def calibrate(ctx: TuneContext, head_dir: str) -> Calibrated:
    """The draft's chains and step costs on search prompts it never trained on."""
    space: GlideSpace = ctx.space
    ws = ctx.workspace
    vocabs = vocab_sizes(head_dir, space.calibration.draft_vocab)
    search = ws.encode(unseen_search_prompts(ws, head_dir, announce=True))
    confirm, rest = confirm_and_calibration(search, space.trials.prompts)
    calibration = ws.continuations(rest[: space.calibration.prompts], space.calibration.tokens)
    chains = calibration_chains(ctx, head_dir, calibration, space.calibration.max_depth, vocabs)
    draft = load_draft_for(ws.ref, head_dir)
    seconds = {
        v: measure_step_seconds(ws.runner, draft, projection_for(ws.ref, head_dir, v))
        for v in vocabs
    }
    for v in vocabs:
        say(
            f"glide draft, vocabulary {v or 'all'}: top-1 by drafting step "
            + ", ".join(f"{a:.3f}" for a in chain_top1(chains[v]))
            + f"; a drafting step {seconds[v] * 1e3:.1f} ms"
        )
    return Calibrated(vocabs, chains, seconds, confirm, len(calibration))


def calibration_chains(
    ctx: TuneContext, head_dir: str, calibration, depth: int, vocabs: list[int]
) -> dict[int, list[ChainSteps]]:
    """The draft's chains along ``calibration`` for every vocabulary, measured once per
    draft, calibration and depth (they do not depend on the device) and kept in the
    study database."""
    import numpy as np

    ws = ctx.workspace

    def measure() -> dict:
        draft = load_draft_for(ws.ref, head_dir)
        projections = {v: projection_for(ws.ref, head_dir, v) for v in vocabs}
        label = "glide: draft chains along greedy decoding (stale target cache)"
        with step(label, len(calibration)) as advance:
            chains = glide_chain_steps(ws.runner, draft, calibration, depth, projections, advance)
        return {
            str(v): [{"confidences": c.confidences.tolist(), "ranks": c.ranks.tolist()} for c in cs]
            for v, cs in chains.items()
        }

    calibration_id = hashlib.sha256(repr(calibration).encode()).hexdigest()[:12]
    data = ws.cached_measurement(
        "glide_chains",
        f"{heads_id(head_dir)}/{calibration_id}/{depth}/{sorted(vocabs)}",
        measure,
        device_bound=False,
    )
    return {
        int(v): [
            ChainSteps(np.asarray(c["confidences"], dtype=float), np.asarray(c["ranks"], dtype=int))
            for c in cs
        ]
        for v, cs in data.items()
    }


def predict(space: GlideSpace, calibrated: Calibrated, curve: LatencyCurve) -> list[dict]:
    """Every (vocabulary, length, threshold) of the grid by predicted speedup, best first."""
    draft = space.draft
    low, high = draft.exit_threshold
    thresholds = sorted({t for t in draft.grid_thresholds if low <= t <= high} | {low})
    rows = []
    for vocab in calibrated.vocabs:
        for length in range(draft.max_tokens[0], draft.max_tokens[1] + 1):
            for threshold in thresholds if length > 1 else [low]:
                policy = DraftExitPolicy(length, threshold, None)
                rule = SelfSpecChain(policy, calibrated.step_seconds[vocab])
                estimate = replay(calibrated.chains[vocab], rule, NO_EXPANSION, curve)
                rows.append(
                    {
                        "vocab": vocab,
                        "max_tokens": length,
                        "exit_threshold": threshold,
                        "predicted_speedup": round(estimate.speedup, 4),
                        "predicted_tokens_per_step": round(estimate.tokens_per_step, 3),
                    }
                )
    rows.sort(key=lambda r: (-r["predicted_speedup"], r["max_tokens"], r["vocab"]))
    return rows


def study_seeds(space: GlideSpace, predicted: list[dict]) -> list[dict]:
    """The best predicted settings, then the reference's (whole vocabulary), clipped to
    the study's ranges; each once."""
    low, high = space.draft.max_tokens
    t_low, t_high = space.draft.exit_threshold
    anchor = space.draft.anchor
    keys = ("max_tokens", "exit_threshold", "vocab")
    wanted = [{k: p[k] for k in keys} for p in predicted[: space.draft.candidates]]
    wanted.append({**anchor, "vocab": 0})
    seeds = [
        {
            "max_tokens": min(max(int(s["max_tokens"]), low), high),
            "exit_threshold": min(max(float(s["exit_threshold"]), t_low), t_high),
            "vocab": int(s["vocab"]),
        }
        for s in wanted
    ]
    return [dict(s) for s in dict.fromkeys(tuple(sorted(s.items())) for s in seeds)]


def draft_study(ctx: TuneContext, head_dir: str, calibrated: Calibrated, predicted: list[dict]):
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    space: GlideSpace = ctx.space
    seeds = study_seeds(space, predicted)
    return run_method_study(
        ctx,
        f"glide/{heads_id(head_dir)}",
        {
            "max_tokens": IntDistribution(*space.draft.max_tokens),
            "exit_threshold": FloatDistribution(*space.draft.exit_threshold),
            "vocab": CategoricalDistribution(calibrated.vocabs),
        },
        GlideObjective(ctx.workspace.ref, head_dir, calibrated.confirm, space.trials.tokens),
        trials=ctx.trials or space.draft.trials,
        seeds=seeds,
        budget=ctx.budget.share(registry.time_share("glide", "study")),
        label="glide draft-length study (measured)",
        attrs={"head": head_dir},
    )


def winner(ctx: TuneContext, study, calibrated: Calibrated, predicted: list[dict]) -> dict:
    """The best measured trial's parameters; the best prediction when none finished."""
    done = [t for t in completed(study) if t.params.get("vocab") in calibrated.vocabs]
    if done:
        return dict(max(done, key=lambda t: t.value).params)
    ctx.note(
        "the GLIDE draft-length study finished no trial within the time budget: keeping "
        "the best predicted setting (a replay of measured draft steps and costs)"
    )
    return {k: predicted[0][k] for k in ("max_tokens", "exit_threshold", "vocab")}
