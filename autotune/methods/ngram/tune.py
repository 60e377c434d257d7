"""Tuning the n-gram method on the search split.

1. *Calibration* (``calibration``): the target's greedy continuations of search prompts
   spread over the workload categories; this device's verify-latency curve; what one
   proposal costs.
2. *Proxy search* (``proxy``): for each kind (prompt lookup, suffix decoding) coordinate
   ascent over its grids, scored by the exact replay of drafting along the continuations
   (``replay``), from the engines' defaults; then the same from each kind's winner on
   each category's continuations alone.
3. *Measured study* (``study``): the proxy's finalists of both kinds decoded for real on
   other search prompts (Ray Tune + Optuna), with a few more trials around them; each
   kind's fastest.
4. *Side by side* (``side_by_side``, fresh timings, same prompts): the two kinds' winners,
   the default the search started from, and every category with its own setting. The
   fastest is the setting; a category keeps its own only where, on its prompts, it beat
   that setting clearly (``per_category``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from autotune import plan
from autotune.measure.timing import EncodedPrompt
from autotune.methods import registry
from autotune.methods.base import Probe, TuneContext
from autotune.methods.ngram import engines
from autotune.methods.ngram.calibration import (
    KINDS,
    Calibration,
    calibrate,
    grids,
    kind_of,
    largest_tree,
    start_config,
)
from autotune.methods.ngram.proxy import Proxy, cached_engine_search, cached_proxy
from autotune.methods.ngram.replay import Replayer
from autotune.methods.ngram.settings import Config, NgramSettings, block_of, describe
from autotune.methods.ngram.side_by_side import (
    Entrants,
    Race,
    category_verdicts,
    drafting_variants,
    entrants,
    measure_in_step,
    side_by_side,
    with_default,
)
from autotune.methods.ngram.space import NgramSpace
from autotune.methods.ngram.study import measured_study

# Read from here by the benchmarks and tests (``grids``, ``kind_of``, ``category_verdicts``
# live in the modules of their step).
__all__ = [
    "KINDS",
    "category_verdicts",
    "grids",
    "kind_of",
    "largest_tree",
    "probe",
    "start_config",
    "tune",
    "tuning_seconds",
    "with_default",
]

# The side by side decodes the timed prompts the study did not, when at least this many.
MIN_UNSEEN = 4


def probe(ctx: TuneContext) -> Probe:
    """The proxy search, then each kind's proxy best decoded against greedy on a few
    search prompts, as long as the verdict's: the run's first measured figures (the
    faster, its interval allowing for the choice between them), and a bound (the proxy's
    prediction or the measurements' upper ends, whichever is highest)."""
    from autotune.plan import PROBE_PROMPTS, Bound

    calibration = calibrate(ctx)
    bests, predicted = proxy_bests(ctx, calibration)
    measured = measure_in_step(
        ctx,
        "n-gram probe: the proxy's bests against greedy",
        drafting_variants(bests),
        calibration.confirm[:PROBE_PROMPTS],
        ctx.max_new_tokens,
        least=0,  # stops at its share, however few it decoded (a busy machine)
    )
    decoded = len(next(iter(measured.values())).prompts)
    if not decoded:  # no time for one prompt: the proxy's word alone
        return Probe(Bound("ngram", predicted, f"the proxy predicted {predicted:.3f}x"), None)
    for m in measured.values():
        m.looks = len(measured)  # the faster of several: its interval allows for the choice
    best = max(measured, key=lambda n: measured[n].speedup)
    highs = [m.interval().high for m in measured.values()]
    bound = Bound(
        "ngram",
        max([predicted, *highs]),
        f"the proxy predicted {predicted:.3f}x; on {decoded} search prompts "
        + ", ".join(f"{n} {m.speedup:.3f}x" for n, m in measured.items()),
    )
    return Probe(bound, measured[best])


def proxy_bests(ctx: TuneContext, calibration: Calibration) -> tuple[dict[str, Config], float]:
    """Each kind's proxy best (with ``--engine``: each engine rule's), each setting once,
    and the highest speedup the proxy predicted."""
    replayer, sequences = calibration.replayer, calibration.sequences
    only = restricted(ctx)
    if only is None:
        proxy = cached_proxy(ctx, replayer, sequences)
        named = [(f"{kind} (proxy best)", proxy.best[kind]) for kind in KINDS]
        predicted = max(proxy.predicted.values())
    else:  # the engines' own rules alone
        found = cached_engine_search(ctx, replayer, sequences, only)
        named = [(f"{f.engine} (proxy best)", f.best) for f in found.values()]
        predicted = max(f.ranked[0][1] for f in found.values())
    unique: dict[str, Config] = {}
    for name, config in named:
        if config not in unique.values():
            unique[name] = config
    return unique, predicted


def restricted(ctx: TuneContext) -> list[str] | None:
    """The engines the search keeps to (``--engine``) when each has a matching rule of
    its own; None: the whole space (no engine named, or one that expresses trees)."""
    if not ctx.engines:
        return None
    only = engines.rule_engines(ctx.engines)
    return only if len(only) == len(ctx.engines) else None


def tune(ctx: TuneContext) -> NgramSettings:
    space: NgramSpace = ctx.space
    calibration = calibrate(ctx)
    replayer = calibration.replayer
    only = restricted(ctx)
    if only is not None:
        found = cached_engine_search(ctx, replayer, calibration.sequences, only)
        return tune_for_engines(ctx, found, calibration)
    proxy = cached_proxy(ctx, replayer, calibration.sequences)
    winners, study, trials = measured_study(ctx, proxy, calibration.confirm, replayer)
    candidates = winners if study is not None else with_default(space, winners)
    # each engine's own rule, searched on the proxy, races beside the tuned candidates:
    # its figures are what the export to that engine carries, and it may win outright
    found = rule_search(ctx, replayer, [*winners.values(), *proxy.best.values()])
    rules = {f"{engine} rule": f.best for engine, f in found.items()}
    race, candidates = race_in_time(ctx, calibration, proxy, candidates, rules, study, trials)
    note_outsider(ctx, race.chosen, rules)
    measured = {candidates[n]: m for n, m in race.measured.items() if n in candidates}
    return NgramSettings(
        selection=race.figures,
        draft=block_of(candidates[race.chosen]),
        by_category={
            c: block_of(proxy.by_category[c]) for c, row in race.verdicts.items() if row["kept"]
        },
        alternatives={
            k: {"draft": block_of(c).model_dump(), "search_speedup": race.selection.get(k)}
            for k, c in candidates.items()
        },
        study=study,
        engines=engines.variants_of(found, measured),
        search={
            "proxy": proxy.record(replayer),
            "proxy_by_category": proxy.rows,
            "measured_trials": trials,
            "side_by_side": {"kinds": race.selection, "categories": race.verdicts},
            **calibration.record(ctx),
        },
    )


def race_in_time(
    ctx: TuneContext,
    calibration: Calibration,
    proxy: Proxy,
    candidates: dict[str, Config],
    rules: Mapping[str, Config],
    study: str | None,
    trials: list[dict],
) -> tuple[Race, dict[str, Config]]:
    """The side by side of the ``candidates``, the engines' ``rules`` and the categories'
    own settings, and the candidates it ran. Its least prompts are decoded whatever the
    time, so it takes only what they can be decoded for in the time left (``entrants``);
    with no time for the candidates themselves, the quick choice."""
    entered = entrants_in_time(ctx, calibration, candidates, rules, proxy.by_category)
    if entered is None:
        return quick_choice(ctx, proxy, trials), candidates
    timed = timed_prompts(ctx.space, calibration.confirm, study)
    return side_by_side(ctx, entered.candidates, entered.by_category, timed), entered.candidates


def rule_search(
    ctx: TuneContext, replayer: Replayer, tuned: list[Config]
) -> dict[str, engines.Found]:
    """The own rules of the engines named (``--engine``; every engine with one where none
    is named) searched on the proxy, from the ``tuned`` settings and transformers'
    default."""
    space: NgramSpace = ctx.space
    return engines.search_all(
        space,
        replayer,
        [*tuned, start_config(space, "ngram")],
        engines.rule_engines(ctx.engines),
        ctx.budget.spent,
    )


def timed_prompts(
    space: NgramSpace, confirm: list[EncodedPrompt], study: str | None
) -> list[EncodedPrompt]:
    """The prompts of the side by side: the study's winners were chosen on its prompts, so
    the others where there are enough of them (a winner's luck on the prompts that chose
    it does not carry over)."""
    unseen = confirm[space.study.prompts :] if study is not None else confirm
    return unseen if len(unseen) >= MIN_UNSEEN else confirm


def quick_choice(ctx: TuneContext, proxy: Proxy, trials: list[dict]) -> Race:
    """No time left for the side by side (a busy machine): the study's fastest trial's
    kind, or where it finished none, the proxy's better kind; the held-back measurement
    will judge it."""
    if trials:
        chosen, why = trials[0]["kind"], "the study's fastest kind"
    else:
        chosen, why = max(KINDS, key=lambda k: proxy.predicted[k]), "the proxy's better kind"
    ctx.note(f"no time was left for the n-gram side by side: {why} ({chosen}) is the setting")
    return Race(chosen)


def entrants_in_time(
    ctx: TuneContext,
    calibration: Calibration,
    required: Mapping[str, Config],
    optional: Mapping[str, Config],
    by_category: Mapping[str, Config],
) -> Entrants | None:
    """``entrants`` in the time the tuning has left, a greedy prompt as long as a trial's
    on this device's curve; what it leaves out is said in one note."""
    space: NgramSpace = ctx.space
    prompt_s = space.trials.tokens * calibration.curve(1)
    entered = entrants(required, optional, by_category, prompt_s, ctx.budget.left())
    if entered is not None and entered.left_out:
        ctx.note(
            "the n-gram side by side had no time to measure "
            + ", ".join(entered.left_out)
            + " (an engine's rule left out carries the proxy's prediction)"
        )
    return entered


def note_outsider(ctx: TuneContext, chosen: str, rules: Collection[str]) -> None:
    """Says so where neither tuned kind won: the default, or an engine's own rule (one of
    ``rules``, by name)."""
    if chosen == "default":
        ctx.note(
            "on the search prompts transformers' default prompt lookup measured faster than "
            "both tuned kinds: it is the setting"
        )
    elif chosen in rules:
        ctx.note(
            f"on the search prompts {chosen.removesuffix(' rule')}'s own prompt lookup "
            f"measured faster than both tuned kinds: it is the setting"
        )


def tune_for_engines(
    ctx: TuneContext, found: dict[str, engines.Found], calibration: Calibration
) -> NgramSettings:
    """``--engine``: each engine's own rule searched on the proxy (``found``), its best few
    decoded against greedy on the timed search prompts; the fastest is the setting."""
    space: NgramSpace = ctx.space
    finalists = space.search.finalists
    candidates: dict[str, Config] = {
        describe(config): config for f in found.values() for config, _ in f.ranked[:finalists]
    }
    # the proxy's best of them first, the others where the time left allows
    best = max((f.ranked[0] for f in found.values()), key=lambda ranked: ranked[1])[0]
    entered = entrants_in_time(ctx, calibration, {describe(best): best}, candidates, {})
    if entered is None:
        ctx.note(
            "no time was left for the n-gram side by side: the proxy's best engine rule "
            f"({describe(best)}) is the setting"
        )
        race = Race(describe(best))
    else:
        candidates = entered.candidates
        race = side_by_side(ctx, candidates, {}, calibration.confirm)
    return NgramSettings(
        selection=race.figures,
        draft=block_of(candidates[race.chosen]),
        engines=engines.variants_of(
            found, {candidates[n]: m for n, m in race.measured.items()}, finalists
        ),
        search={
            "restricted_to": list(found),
            "side_by_side": {"settings": race.selection},
            **calibration.record(ctx),
        },
    )


def tuning_seconds(space: NgramSpace, forward_s: float, trials: int) -> float:
    """About how long ``tune`` takes to finish ``trials`` whole trials (after the probe,
    whose proxy search it reuses): a whole trial decodes ``study.prompts`` prompts at
    about ``plan.DRAFT_FREE_COST`` of greedy's time; each one is accompanied by the
    trials ASHA prunes at its rung (two for each one promoted, each ``study.grace``
    prompts long) and by greedy re-timing (every prompt, once its timing is old); every
    trial starts its worker's decoding and warms up; greedy is timed on every prompt once
    first. The study is
    the measured study's share of the time, the side by side after it the rest."""
    from autotune.measure.shared_greedy import RETIME_AFTER_S
    from autotune.methods.studies import REDUCTION_FACTOR

    prompt_s = space.trials.tokens * forward_s
    study = space.study
    whole = study.prompts * prompt_s * plan.DRAFT_FREE_COST + plan.TRIAL_START_S
    pruned = min(study.grace, study.prompts) * prompt_s * plan.DRAFT_FREE_COST + plan.TRIAL_START_S
    # re-timing: each prompt once its timing is RETIME_AFTER_S old
    retiming = 1 + study.prompts * prompt_s / RETIME_AFTER_S
    per_whole = (whole + (REDUCTION_FACTOR - 1) * pruned) * retiming
    seconds = trials * per_whole + study.prompts * prompt_s
    return seconds / registry.time_share("ngram", "measured study")
