"""Tuning the self-speculative method on the search split: a skip-mask search on a proxy,
wall-clock confirmation of the best masks, then the draft-exit rule for the winner."""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass

from autotune.drafters.self_spec import DV_DEFAULT_POLICY, DraftExitPolicy, LayerSkipDrafter
from autotune.engine.skip import SkipMask
from autotune.measure.costs import LatencyCurve, SublayerCosts
from autotune.measure.timing import measure_with_progress
from autotune.methods import registry
from autotune.methods.base import Probe, TuneContext
from autotune.methods.heads import confirm_and_calibration
from autotune.methods.self_spec import trials
from autotune.methods.self_spec.settings import SelfSpecSettings
from autotune.methods.self_spec.space import SelfSpecSpace
from autotune.methods.studies import completed, run_method_study
from autotune.progress import say
from autotune.tuners.skip_mask import seed_masks


@dataclass(frozen=True)
class MaskCandidate:
    skip: SkipMask
    policy: DraftExitPolicy  # the best static draft exit the proxy found for it
    proxy: float  # predicted speedup


def split_search(ctx: TuneContext) -> tuple[list, list]:
    """Prompts to time trials on, and the continuations of others for the proxy: no
    trial times a prompt the proxy was fitted on (the rule of every method)."""
    space: SelfSpecSpace = ctx.space
    ws = ctx.workspace
    timed, rest = confirm_and_calibration(ws.encode(ws.search_prompts()), space.trials.prompts)
    calibration = ws.continuations(rest[: space.calibration.prompts], space.calibration.tokens)
    return timed, calibration


def probe(ctx: TuneContext) -> Probe:
    """The seed masks scored on the proxy (the draft's agreement with the target along its
    greedy continuations, costed by this device's curves): a bound with headroom for the
    search that would follow."""
    from autotune.plan import proxy_bound

    space = ctx.space.skip_mask
    ws = ctx.workspace
    _, calibration = split_search(ctx)
    curve, costs = ws.device_costs()
    announce_costs(curve)
    layers = ws.runner.num_layers
    objective = trials.SkipMaskObjective(ws.ref, calibration, costs, curve.relative(), space)
    seeds = seed_masks(
        space.skippable_layers(layers), layers, space.min_skip_ratio, space.max_skip_ratio
    )
    scores: list[float] = []
    for mask in seeds:
        if scores and ctx.budget.spent():
            break
        result = objective.evaluate(mask)
        if result.get("feasible"):
            scores.append(result["objective"])
    if not scores:
        raise_no_mask(space)
    return Probe(proxy_bound("self_spec", max(scores), len(scores)))


def tune(ctx: TuneContext) -> SelfSpecSettings:
    ws = ctx.workspace
    search, calibration = split_search(ctx)
    curve, costs = ws.device_costs()
    announce_costs(curve)
    candidates, mask_trials = search_masks(ctx, calibration, costs, curve)
    confirmed = confirm_masks(ctx, candidates, search)
    best = confirmed[0][1]
    policy, exit_trials = tune_draft_exit(ctx, best, search)
    return SelfSpecSettings.of(
        best.skip,
        policy,
        study=f"{ws.target.name}/self_spec",
        search={
            "mask_trials": mask_trials,
            "exit_trials": exit_trials,
            "proxy_best": round(max(c.proxy for c in candidates), 4),
            "confirmed_on_search_prompts": [
                {"skip": c.skip.as_dict(), "speedup": round(v, 4), "proxy": round(c.proxy, 4)}
                for v, c in confirmed
            ],
            **ws.verify_record(curve),
            "draft_cost_relative": round(costs.draft_ratio(best.skip), 4),
            "skip_ratio": round(best.skip.ratio(costs.num_layers), 4),
            "seconds": round(ctx.budget.elapsed(), 1),
        },
    )


def announce_costs(curve: LatencyCurve) -> None:
    relative = curve.relative()
    say(
        f"one target forward: {curve(1) * 1e3:.1f} ms; verifying n tokens costs "
        + ", ".join(f"{n}: {relative[n - 1]:.2f}x" for n in (2, 4, 8, 16) if n <= len(relative))
    )


def search_masks(
    ctx: TuneContext, calibration, costs: SublayerCosts, curve: LatencyCurve
) -> tuple[list[MaskCandidate], int]:
    """Bayesian optimisation of the mask on the proxy; the best distinct masks, and the
    study's trial count. Seed masks stand in when no trial finished in time."""
    space = ctx.space.skip_mask
    ws = ctx.workspace
    layers = ws.runner.num_layers
    objective = trials.SkipMaskObjective(ws.ref, calibration, costs, curve.relative(), space)
    seeds = seed_masks(
        space.skippable_layers(layers), layers, space.min_skip_ratio, space.max_skip_ratio
    )
    study = run_method_study(
        ctx,
        "self_spec/skip_mask",
        trials.mask_distributions(space, layers),
        objective,
        trials=ctx.trials or space.trials,
        sampler=mask_sampler(space.sampler),
        seeds=[trials.params_from_mask(m, space, layers) for m in seeds],
        budget=ctx.budget.share(registry.time_share("self_spec", "mask search")),
        timed=False,
        label="skip-mask search (proxy)",
        objective_text="proxy speedup (teacher-forced draft traces, measured costs)",
    )
    candidates = best_masks(study, space.confirm_top)
    if not candidates:
        ctx.note(
            "the skip-mask search finished no trial within its time budget: the seed "
            "masks were scored on the proxy instead"
        )
        scored = [(objective.evaluate(m), m) for m in seeds]
        candidates = [
            MaskCandidate(m, _static_policy(r), r["objective"])
            for r, m in sorted(scored, key=lambda x: -x[0]["objective"])
            if r.get("feasible")
        ][: space.confirm_top]
    if not candidates:
        raise_no_mask(space)
    return candidates, len(study.trials)


def raise_no_mask(space) -> None:
    from autotune.errors import AutotuneError

    raise AutotuneError(
        f"no skip mask fits the search space (skip ratio "
        f"{space.min_skip_ratio}..{space.max_skip_ratio} of layers "
        f"{space.keep_first}.. from the end {space.keep_last}): widen it with "
        "--search-space self_spec=FILE"
    )


def mask_sampler(name: str, seed: int = 0):
    import warnings

    import optuna

    if name == "skopt":
        from autotune.tuners.skopt_sampler import SkoptSampler

        return SkoptSampler(seed=seed)
    with warnings.catch_warnings():  # Optuna marks the option experimental: not our user's news
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.GPSampler(seed=seed, deterministic_objective=True)


def best_masks(study, count: int) -> list[MaskCandidate]:
    """The best distinct feasible masks of a finished study, best first."""
    done = [t for t in completed(study) if t.user_attrs.get("feasible", True) and t.value]
    done.sort(key=lambda t: t.value, reverse=True)
    seen: set[SkipMask] = set()
    out = []
    for trial in done:
        skip = trials.mask_from_params(trial.params)
        if skip in seen or skip.size == 0:
            continue
        seen.add(skip)
        out.append(MaskCandidate(skip, _static_policy(trial.user_attrs), trial.value))
        if len(out) == count:
            break
    return out


def _static_policy(attrs: dict) -> DraftExitPolicy:
    return DraftExitPolicy(
        int(attrs.get("max_tokens", 1)), float(attrs.get("exit_threshold", 0.0)), adaptive=None
    )


def confirm_masks(
    ctx: TuneContext, candidates: list[MaskCandidate], search
) -> list[tuple[float, MaskCandidate]]:
    """Each candidate decoded for real on search prompts; fastest first."""
    runs = ctx.space.trials
    confirmed = []
    for rank, candidate in enumerate(candidates, 1):
        measured = measure_with_progress(
            f"confirm mask {rank}/{len(candidates)} (proxy {candidate.proxy:.3f}x)",
            ctx.workspace.runner,
            functools.partial(LayerSkipDrafter, candidate.skip, candidate.policy),
            search[: runs.prompts],
            runs.tokens,
            until=ctx.budget,
        )
        confirmed.append((measured.speedup, candidate))
    return sorted(confirmed, key=lambda row: row[0], reverse=True)


def tune_draft_exit(ctx: TuneContext, best: MaskCandidate, search) -> tuple[DraftExitPolicy, int]:
    """The draft-exit rule for the chosen mask, on measured speedup; the proxy's static
    rule when no trial finished in time."""
    space = ctx.space.draft_exit
    runs = ctx.space.trials
    study = run_method_study(
        ctx,
        f"self_spec/draft_exit/{mask_id(best.skip)}",
        trials.exit_distributions(space),
        trials.DraftExitObjective(
            ctx.workspace.ref, best.skip, search[: runs.prompts], runs.tokens
        ),
        trials=space.trials,
        sampler=exit_sampler(),
        seeds=[
            trials.params_from_policy(best.policy, space),
            trials.params_from_policy(DV_DEFAULT_POLICY, space),
        ],
        budget=ctx.budget.share(registry.time_share("self_spec", "draft-exit study")),
        timed=True,
        label="draft-exit tuning (measured)",
        objective_text="measured speedup",
        attrs={"skip": best.skip.as_dict()},
    )
    done = completed(study)
    if not done:
        if space.trials:
            ctx.note(
                "the draft-exit study finished no trial within its time budget: "
                "keeping the proxy's static draft exit"
            )
        return best.policy, len(study.trials)
    return trials.policy_from_params(study.best_trial.params), len(study.trials)


def exit_sampler():
    import optuna

    return optuna.samplers.TPESampler(seed=0, n_startup_trials=4)


def mask_id(skip: SkipMask) -> str:
    return hashlib.sha256(str(skip).encode()).hexdigest()[:8]
