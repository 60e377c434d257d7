"""The n-gram tuning's measured study: the proxy's finalists of both kinds decoded for
real on search prompts (Ray Tune + Optuna), with a few more trials around them; each
kind's fastest."""

from __future__ import annotations

import hashlib

from autotune.measure.timing import EncodedPrompt
from autotune.methods import registry
from autotune.methods.base import TuneContext
from autotune.methods.ngram import trials as ngram_trials
from autotune.methods.ngram.calibration import KINDS, start_config
from autotune.methods.ngram.proxy import Proxy
from autotune.methods.ngram.replay import Replayer
from autotune.methods.ngram.settings import Config
from autotune.methods.ngram.space import NgramSpace
from autotune.methods.studies import completed, run_method_study
from autotune.progress import say


def measured_study(
    ctx: TuneContext, proxy: Proxy, prompts: list[EncodedPrompt], replayer: Replayer
) -> tuple[dict[str, Config], str | None, list[dict]]:
    """Each kind's fastest measured setting (the proxy's best where its study finished no
    trial of that kind), the study's name, and its trials. Every trial is first scored on
    the proxy (``replayer``): one predicted below ``study.proxy_screen`` of the proxy's
    best is pruned before it decodes."""
    import optuna

    space: NgramSpace = ctx.space
    wanted = ctx.trials if ctx.trials is not None else space.study.trials
    if wanted == 0:
        return dict(proxy.best), None, []
    seeds = study_seeds(space, proxy)
    study = run_method_study(
        ctx,
        f"ngram/{prompts_id(prompts)}",
        ngram_trials.distributions(space),
        ngram_trials.NgramObjective(
            ctx.workspace.ref,
            prompts[: space.study.prompts],
            space.trials.tokens,
            grace=1 + space.study.grace,  # the proxy's result, then the prompts
            proxy=Replayer(replayer.sequences, replayer.costs),  # without its replays
            proxy_floor=space.study.proxy_screen * max(proxy.predicted.values()),
        ),
        trials=wanted,
        seeds=seeds[:wanted],
        sampler=optuna.samplers.TPESampler(seed=0, n_startup_trials=min(len(seeds), wanted)),
        budget=ctx.budget.share(registry.time_share("ngram", "measured study")),
        label="n-gram study (measured)",
        objective_text="measured speedup",
    )
    done = completed(study)
    _say_pruned(study, done)
    if not done:
        ctx.note("the n-gram study finished no trial in time: the proxy's best are measured")
    rows = sorted(
        ({**t.params, "speedup": round(t.value, 4)} for t in done),
        key=lambda row: -row["speedup"],
    )
    return _winners(done, proxy), study.study_name, rows


def study_seeds(space: NgramSpace, proxy: Proxy) -> list[dict]:
    """The study's first trials, each once: the proxy's finalists, then the engines'
    defaults (measured like any setting: the chosen one is the faster of them on the
    study's prompts)."""
    starts = [start_config(space, kind) for kind in KINDS]
    seeds = [ngram_trials.params_from_config(c, space) for c in proxy.finalists + starts]
    return [dict(s) for s in dict.fromkeys(tuple(sorted(s.items())) for s in seeds)]


def _say_pruned(study, done: list) -> None:
    import optuna

    pruned = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.PRUNED,))
    screened = sum(len(t.intermediate_values) <= 1 for t in pruned)
    say(
        f"n-gram study: {len(done)} trials decoded every prompt, {len(pruned)} were pruned "
        f"({screened} on the proxy, before decoding)"
    )


def _winners(done: list, proxy: Proxy) -> dict[str, Config]:
    """Each kind's fastest finished trial, or the proxy's best where none finished."""
    winners = {}
    for kind in KINDS:
        mine = [t for t in done if t.params.get("kind") == kind]
        best = max(mine, key=lambda t: t.value).params if mine else None
        winners[kind] = ngram_trials.config_from_params(best) if best else proxy.best[kind]
    return winners


def prompts_id(prompts: list[EncodedPrompt]) -> str:
    return hashlib.sha256(repr([p.ids for p in prompts]).encode()).hexdigest()[:8]
