"""Tune the self-speculative method end to end: mask search on the proxy, wall-clock
confirmation of the best masks, draft-exit tuning, held-back measurement."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import optuna

from autotune.drafters.self_spec import (DV_DEFAULT_POLICY, DraftExitPolicy,
                                         LayerSkipDrafter)
from autotune.engine.skip import SkipMask
from autotune.measure.timing import Measurement, measure_with_progress
from autotune.progress import say
from autotune.prompts import split_prompts
from autotune.studies.tune import StudySpec, Workers, run_study
from autotune.tuners import draft_exit, skip_mask
from autotune.tuners.space import SelfSpecSpace
from autotune.workspace import Workspace


@dataclass
class SearchLimits:
    trials: int | None = None          # mask-search trials; None: the search space's
    time_budget_s: float | None = None  # for both studies together
    workers: Workers = field(default_factory=Workers)  # where trials run, how many at once


@dataclass
class SelfSpecResult:
    skip: SkipMask
    policy: DraftExitPolicy
    measured: Measurement            # on held-back prompts
    study: str
    search: dict


def _sampler(name: str, seed: int = 0):
    if name == "skopt":
        from autotune.tuners.skopt_sampler import SkoptSampler
        return SkoptSampler(seed=seed)
    return optuna.samplers.GPSampler(seed=seed, deterministic_objective=True)


def measure_policy(ws: Workspace, skip: SkipMask, policy: DraftExitPolicy,
                   prompts: list[tuple[str, list[int]]], tokens: int, label: str) -> Measurement:
    return measure_with_progress(label, ws.runner, lambda: LayerSkipDrafter(skip, policy),
                                 prompts, tokens)


@dataclass
class SelfSpecChoice:
    skip: SkipMask
    policy: DraftExitPolicy
    search: dict


def tune_self_spec(ws: Workspace, space: SelfSpecSpace, limits: SearchLimits) -> SelfSpecResult:
    """Search on the search split, then measure on the held-back split."""
    choice = search_self_spec(ws, space, limits)
    held = ws.encode(split_prompts(ws.prompts)[1][: space.measure.confirm_prompts])
    measured = measure_policy(ws, choice.skip, choice.policy, held,
                              space.measure.confirm_tokens, "held-back confirmation")
    return SelfSpecResult(choice.skip, choice.policy, measured, f"{ws.target.name}/self_spec",
                          choice.search)


def search_self_spec(ws: Workspace, space: SelfSpecSpace, limits: SearchLimits) -> SelfSpecChoice:
    """Mask and draft-exit rule from the search split of the prompts only."""
    started = time.monotonic()
    budget = limits.time_budget_s

    def remaining(share: float) -> float | None:
        return None if budget is None else max(1.0, share * (budget - (time.monotonic() - started)))

    search = ws.encode(split_prompts(ws.prompts)[0])
    calibration = ws.continuations(search[: space.calibration.prompts], space.calibration.tokens)
    curve, costs = ws.device_costs()
    verify_relative = curve.relative()
    num_layers = ws.runner.num_layers
    name = ws.target.name
    say(f"one target forward: {curve(1) * 1e3:.1f} ms; verifying n tokens costs "
        + ", ".join(f"{n}: {verify_relative[n - 1]:.2f}x" for n in (2, 4, 8, 16)))

    # 1. Mask search on the proxy.
    mask_space = space.skip_mask
    mask_study = run_study(StudySpec(
        name=f"{name}/self_spec/skip_mask", storage_url=ws.storage,
        space=skip_mask.search_distributions(mask_space, num_layers), metric="objective",
        trials=limits.trials or mask_space.trials, sampler=_sampler(mask_space.sampler),
        seeds=[skip_mask.params_from_mask(m, mask_space, num_layers)
               for m in skip_mask.seed_masks(mask_space, num_layers)],
        time_budget_s=remaining(0.6), timed=False,
        user_attrs={"model": name, "fingerprint": ws.target.fingerprint, "method": "self_spec",
                    "objective": "proxy speedup (teacher-forced draft traces, measured costs)"}),
        skip_mask.SkipMaskObjective(ws.ref, calibration, costs, verify_relative, mask_space),
        label="skip-mask search (proxy)", workers=limits.workers)

    # 2. Confirm the best distinct masks by wall-clock decoding on search prompts.
    measure = space.measure
    trial_prompts = search[: measure.search_prompts]
    candidates = _top_masks(mask_study, mask_space.confirm_top)
    if not candidates:
        raise RuntimeError("the skip-mask search finished no trial; see `autotune studies`")
    confirmed = []
    for rank, (skip, policy, proxy) in enumerate(candidates, 1):
        m = measure_policy(ws, skip, policy, trial_prompts, measure.search_tokens,
                           f"confirm mask {rank}/{len(candidates)} (proxy {proxy:.3f}x)")
        confirmed.append((m.speedup, skip, policy, proxy))
    confirmed.sort(key=lambda row: row[0], reverse=True)
    _, skip, proxy_policy, _ = confirmed[0]

    # 3. Draft-exit rule for that mask, on measured speedup.
    exit_space = space.draft_exit
    exit_study = run_study(StudySpec(
        name=f"{name}/self_spec/draft_exit/{_mask_id(skip)}", storage_url=ws.storage,
        space=draft_exit.search_distributions(exit_space), metric="objective",
        trials=exit_space.trials, sampler=_exit_sampler(),
        seeds=[draft_exit.params_from_policy(proxy_policy, exit_space),
               draft_exit.params_from_policy(DV_DEFAULT_POLICY, exit_space)],
        time_budget_s=remaining(0.9), timed=True, threads=ws.hardware["threads"],
        user_attrs={"model": name, "fingerprint": ws.target.fingerprint, "method": "self_spec",
                    "skip": skip.as_dict(), "objective": "measured speedup"}),
        draft_exit.DraftExitObjective(ws.ref, skip, trial_prompts, measure.search_tokens),
        label="draft-exit tuning (measured)", workers=limits.workers)
    exit_done = exit_study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    # With the time budget spent before any exit trial finished, keep the confirmed policy.
    policy = draft_exit.policy_from_params(exit_study.best_trial.params) if exit_done \
        else proxy_policy
    search_info = {
        "mask_trials": len(mask_study.trials), "exit_trials": len(exit_study.trials),
        "proxy_best": round(mask_study.best_value, 4),
        "confirmed_on_search_prompts": [
            {"skip": s.as_dict(), "speedup": round(v, 4), "proxy": round(p, 4)}
            for v, s, _, p in confirmed],
        "draft_exit_best_search_speedup": round(exit_study.best_value, 4) if exit_done else None,
        "verify_cost_relative": [round(v, 3) for v in verify_relative],
        "draft_cost_relative": round(costs.draft_ratio(skip), 4),
        "skip_ratio": round(skip.ratio(num_layers), 4),
        "seconds": round(time.monotonic() - started, 1),
    }
    return SelfSpecChoice(skip, policy, search_info)


def _exit_sampler():
    return optuna.samplers.TPESampler(seed=0, n_startup_trials=4)


def _mask_id(skip: SkipMask) -> str:
    import hashlib

    return hashlib.sha256(str(skip).encode()).hexdigest()[:8]


def _top_masks(study, count: int):
    done = [t for t in study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
            if t.user_attrs.get("feasible", True) and t.value and t.value > 0]
    done.sort(key=lambda t: t.value, reverse=True)
    seen, out = set(), []
    for trial in done:
        skip = skip_mask.mask_from_params(trial.params)
        if skip in seen or skip.size == 0:
            continue
        seen.add(skip)
        attrs = trial.user_attrs
        policy = DraftExitPolicy(int(attrs.get("max_tokens", 1)),
                                 float(attrs.get("exit_threshold", 0.0)), adaptive=None)
        out.append((skip, policy, trial.value))
        if len(out) == count:
            break
    return out
