"""Tuning the n-gram method on the search split.

1. *Calibration*: the target's greedy continuations of search prompts spread over the
   workload categories; this device's verify-latency curve; what one proposal costs.
2. *Proxy search*: for each kind (prompt lookup, suffix decoding) coordinate ascent over
   its grids, scored by the exact replay of drafting along the continuations
   (``replay``), from the engines' defaults; then the same from each kind's winner on
   each category's continuations alone.
3. *Measured study*: the proxy's finalists of both kinds decoded for real on other search
   prompts (Ray Tune + Optuna), with a few more trials around them; each kind's fastest.
4. *Side by side* (fresh timings, same prompts): the two kinds' winners, the default the
   search started from, and every category with its own setting. The fastest is the
   setting; a category keeps its own only where, on its prompts, it beat that setting
   clearly (``per_category``).
"""

from __future__ import annotations

import functools
import hashlib
import itertools
from dataclasses import dataclass, field

from autotune import plan
from autotune.drafters.ngram import LookupConfig, NgramDrafter
from autotune.drafters.suffix import SuffixConfig
from autotune.errors import AutotuneError
from autotune.measure.costs import LatencyCurve
from autotune.measure.stats import Pairs, bootstrap_interval
from autotune.measure.timing import (
    EncodedPrompt,
    Measurement,
    Variant,
    categories_in_turn,
    measure_variants,
)
from autotune.methods.base import Probe, TuneContext
from autotune.methods.ngram import engines
from autotune.methods.ngram.replay import Continuation, Costs, Replayer, time_drafting
from autotune.methods.ngram.search import Scored, ascend
from autotune.methods.ngram.settings import (
    Config,
    NgramSettings,
    block_of,
    describe,
)
from autotune.methods.ngram.space import NgramSpace, PerCategory
from autotune.methods.studies import completed, run_method_study
from autotune.profile.blocks import Figures
from autotune.progress import say, step

KINDS = ("ngram", "suffix")
# The side by side decodes the timed prompts the study did not, when at least this many.
MIN_UNSEEN = 4
# Continuations whose replay times one proposal of each kind.
TIMED_SEQUENCES = 4


@dataclass
class Proxy:
    """What the proxy search found."""

    best: dict[str, Config]  # kind -> best on every calibration continuation
    predicted: dict[str, float]  # kind -> its predicted speedup
    finalists: list[Config]  # each kind's best distinct settings, the kinds in turn
    by_category: dict[str, Config] = field(default_factory=dict)  # category -> its best
    rows: dict[str, dict] = field(default_factory=dict)  # category -> what it predicted


def probe(ctx: TuneContext) -> Probe:
    """The proxy search, then each kind's proxy best decoded against greedy on a few
    search prompts, as long as the verdict's: the run's first measured figures (the
    faster, its interval allowing for the choice between them), and a bound (the proxy's
    prediction or the measurements' upper ends, whichever is highest)."""
    from autotune.plan import PROBE_PROMPTS, Bound

    confirm, sequences = split_search(ctx)
    curve = ctx.workspace.verify_curve(largest_tree(ctx.space) + 1)
    replayer, _ = make_replayer(ctx, sequences, curve)
    unique: dict[str, Config] = {}
    only = restricted(ctx)
    if only is None:
        proxy = cached_proxy(ctx, replayer, sequences)
        for kind in KINDS:
            if proxy.best[kind] not in unique.values():
                unique[f"{kind} (proxy best)"] = proxy.best[kind]
        predicted = max(proxy.predicted.values())
    else:  # the engines' own rules alone
        found = cached_engine_search(ctx, replayer, sequences, only)
        for f in found.values():
            if f.best not in unique.values():
                unique[f"{f.engine} (proxy best)"] = f.best
        predicted = max(f.ranked[0][1] for f in found.values())
    variants = {n: Variant(functools.partial(NgramDrafter, c)) for n, c in unique.items()}
    prompts = confirm[:PROBE_PROMPTS]
    label = "n-gram probe: the proxy's bests against greedy"
    with step(label, len(prompts) * len(variants)) as advance:
        measured = measure_variants(
            ctx.workspace.runner,
            variants,
            prompts,
            ctx.max_new_tokens,
            on_prompt=lambda _: advance(),
            until=ctx.budget,  # stops at its share, however few it decoded (a busy machine)
            least=0,
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


def cached_proxy(ctx: TuneContext, replayer: Replayer, sequences: list[Continuation]) -> Proxy:
    """The proxy search on these continuations, once per process (the probe runs it, the
    tuning that follows reuses it)."""
    from autotune.process_cache import cached

    return cached(_search_key("ngram_proxy", ctx, sequences), lambda: proxy_search(ctx, replayer))


def cached_engine_search(
    ctx: TuneContext, replayer: Replayer, sequences: list[Continuation], only: list[str]
) -> dict[str, engines.Found]:
    """``--engine``: the engines' own rules searched on the proxy from transformers'
    default, once per process (the probe runs it, the tuning that follows reuses it)."""
    from autotune.process_cache import cached

    return cached(
        (*_search_key("ngram_engines", ctx, sequences), tuple(only)),
        lambda: engines.search_all(
            ctx.space, replayer, [start_config(ctx.space, "ngram")], only, ctx.budget.spent
        ),
    )


def _search_key(name: str, ctx: TuneContext, sequences: list[Continuation]) -> tuple:
    digest = hashlib.sha256(repr([(s.prompt, s.tokens) for s in sequences]).encode())
    return (name, digest.hexdigest(), ctx.space.model_dump_json())


def restricted(ctx: TuneContext) -> list[str] | None:
    """The engines the search keeps to (``--engine``) when each has a matching rule of
    its own; None: the whole space (no engine named, or one that expresses trees)."""
    if not ctx.engines:
        return None
    only = engines.rule_engines(ctx.engines)
    return only if len(only) == len(ctx.engines) else None


def tune(ctx: TuneContext) -> NgramSettings:
    space: NgramSpace = ctx.space
    confirm, sequences = split_search(ctx)
    curve = ctx.workspace.verify_curve(largest_tree(space) + 1)
    replayer, draft_seconds = make_replayer(ctx, sequences, curve)
    only = restricted(ctx)
    if only is not None:
        found = cached_engine_search(ctx, replayer, sequences, only)
        return tune_for_engines(ctx, found, confirm, replayer, curve, draft_seconds)
    proxy = cached_proxy(ctx, replayer, sequences)
    winners, study, trials = measured_study(ctx, proxy, confirm, replayer)
    # the study's winners were chosen on its prompts: the side by side decodes the others
    # (a winner's luck on the prompts that chose it does not carry over)
    unseen = confirm[space.study.prompts :] if study is not None else confirm
    candidates = winners if study is not None else with_default(space, winners)
    timed = unseen if len(unseen) >= MIN_UNSEEN else confirm
    # each engine's own rule, searched on the proxy, races beside the tuned candidates:
    # its figures are what the export to that engine carries, and it may win outright
    found = engines.search_all(
        space,
        replayer,
        [*winners.values(), *proxy.best.values(), start_config(space, "ngram")],
        engines.rule_engines(ctx.engines),
        ctx.budget.spent,
    )
    rules = {f"{engine} rule": f.best for engine, f in found.items()}
    measured: dict[str, Measurement] = {}
    figures: Figures | None
    selection: dict[str, float]
    verdicts: dict[str, dict]
    if not trials and ctx.budget.spent():
        # no time left (a busy machine): nothing optional; the proxy's better kind, which
        # the held-back measurement will judge
        chosen = max(KINDS, key=lambda k: proxy.predicted[k])
        selection, verdicts, figures = {}, {}, None
        ctx.note(
            "no time was left for the n-gram study or its side by side: the proxy's best "
            f"({chosen}) is the setting"
        )
    else:
        candidates = {**candidates, **rules}
        chosen, selection, verdicts, figures, measured = side_by_side(
            ctx, candidates, proxy.by_category, timed
        )
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
    own = engines.variants_of(
        found, {candidates[n]: m for n, m in measured.items() if n in candidates}
    )
    kept = {c: proxy.by_category[c] for c, row in verdicts.items() if row["kept"]}
    return NgramSettings(
        selection=figures,
        draft=block_of(candidates[chosen]),
        by_category={c: block_of(config) for c, config in kept.items()},
        alternatives={
            k: {"draft": block_of(c).model_dump(), "search_speedup": selection.get(k)}
            for k, c in candidates.items()
        },
        study=study,
        engines=own,
        search={
            "proxy": {
                k: {
                    "best": block_of(proxy.best[k]).model_dump(),
                    "predicted_speedup": round(proxy.predicted[k], 4),
                    "predicted_tokens_per_step": round(
                        replayer.tokens_per_step(proxy.best[k], replayer.indices()), 4
                    ),
                }
                for k in KINDS
            },
            "proxy_by_category": proxy.rows,
            "measured_trials": trials,
            "side_by_side": {"kinds": selection, "categories": verdicts},
            "calibration": {"continuations": len(sequences), "confirm_prompts": len(confirm)},
            "draft_seconds": {k: round(v, 6) for k, v in draft_seconds.items()},
            **ctx.workspace.verify_record(curve),
            "seconds": round(ctx.budget.elapsed(), 1),
        },
    )


def tune_for_engines(
    ctx: TuneContext,
    found: dict[str, engines.Found],
    confirm: list[EncodedPrompt],
    replayer: Replayer,
    curve: LatencyCurve,
    draft_seconds: dict[str, float],
) -> NgramSettings:
    """``--engine``: each engine's own rule searched on the proxy (``found``), its best few
    decoded against greedy on the timed search prompts; the fastest is the setting."""
    space: NgramSpace = ctx.space
    finalists = space.search.finalists
    candidates: dict[str, Config] = {
        describe(config): config for f in found.values() for config, _ in f.ranked[:finalists]
    }
    chosen, selection, _, figures, measured = side_by_side(ctx, candidates, {}, confirm)
    return NgramSettings(
        selection=figures,
        draft=block_of(candidates[chosen]),
        engines=engines.variants_of(
            found, {candidates[n]: m for n, m in measured.items()}, finalists
        ),
        search={
            "restricted_to": list(found),
            "side_by_side": {"settings": selection},
            "calibration": {
                "continuations": len(replayer.sequences),
                "confirm_prompts": len(confirm),
            },
            "draft_seconds": {k: round(v, 6) for k, v in draft_seconds.items()},
            **ctx.workspace.verify_record(curve),
            "seconds": round(ctx.budget.elapsed(), 1),
        },
    )


# --- calibration -------------------------------------------------------------------------


def split_search(ctx: TuneContext) -> tuple[list[EncodedPrompt], list[Continuation]]:
    """Search prompts for wall-clock measurement, and the greedy continuations of other
    search prompts for the proxy: no prompt is timed that the proxy was fitted on."""
    space: NgramSpace = ctx.space
    ws = ctx.workspace
    search = ws.encode(ws.search_prompts())
    confirm = categories_in_turn(search, space.trials.prompts)
    rest = [p for p in search if p not in confirm] or search
    chosen = categories_in_turn(rest, space.calibration.prompts)
    category = {tuple(p.ids): p.category for p in chosen}
    tokens = space.calibration.tokens
    sequences = [
        Continuation(tuple(ids), tuple(cont), tokens, category.get(tuple(ids)))
        for ids, cont in ws.continuations(chosen, tokens)
    ]
    if not sequences:
        raise AutotuneError(
            "no search prompt gave a continuation to tune n-gram drafting on: pass "
            "--prompts with more prompts, or a larger --max-new-tokens"
        )
    return confirm, sequences


def make_replayer(
    ctx: TuneContext, sequences: list[Continuation], curve: LatencyCurve
) -> tuple[Replayer, dict[str, float]]:
    """The proxy, with the verify curve and one proposal's measured cost per kind."""
    space: NgramSpace = ctx.space
    starts = {kind: start_config(space, kind) for kind in KINDS}
    seconds = {
        kind: time_drafting(config, sequences[:TIMED_SEQUENCES]) for kind, config in starts.items()
    }
    say(
        f"one target forward {curve(1) * 1e3:.1f} ms; one proposal: prompt lookup "
        f"{seconds['ngram'] * 1e3:.2f} ms, suffix {seconds['suffix'] * 1e3:.2f} ms"
    )
    costs = {kind: Costs(curve, s) for kind, s in seconds.items()}
    return Replayer(sequences, lambda config: costs[kind_of(config)]), seconds


def largest_tree(space: NgramSpace) -> int:
    """The most tokens a step may verify (the root not counted): the curve's reach."""
    return max(
        *space.ngram.max_tree_tokens,
        *space.suffix.max_tree_tokens,
        space.ngram.start.max_tree_tokens,
        space.suffix.start.max_tree_tokens,
    )


def kind_of(config: Config) -> str:
    """Whose proposal cost a setting pays (an engine's rule: prompt lookup's)."""
    return "suffix" if isinstance(config, SuffixConfig) else "ngram"


def start_config(space: NgramSpace, kind: str) -> Config:
    if kind == "ngram":
        return LookupConfig(**space.ngram.start.model_dump())
    return SuffixConfig(**space.suffix.start.model_dump())


def grids(space: NgramSpace, kind: str) -> dict[str, list]:
    grid = space.ngram if kind == "ngram" else space.suffix
    return {name: list(values) for name, values in grid if name != "start"}


# --- the proxy search ----------------------------------------------------------------------


def proxy_search(ctx: TuneContext, replayer: Replayer) -> Proxy:
    space: NgramSpace = ctx.space
    budget = ctx.budget.part(plan.NGRAM_PROXY_SHARE)
    everything = replayer.indices()
    best, predicted, ranked = {}, {}, []
    for kind in KINDS:
        scored = Scored(functools.partial(replayer.speedup, indices=everything))
        with step(f"n-gram proxy search: {kind}", 1) as advance:
            best[kind] = ascend(
                start_config(space, kind),
                grids(space, kind),
                scored,
                space.search.passes,
                budget.spent,
            )
            advance()
        predicted[kind] = scored(best[kind])
        ranked.append([config for config, _ in scored.best(space.search.finalists)])
        say(f"{kind}: predicted {predicted[kind]:.3f}x with {describe(best[kind])}")
    # the kinds in turn, so that a small trial budget measures both
    finalists = [c for row in itertools.zip_longest(*ranked) for c in row if c is not None]
    proxy = Proxy(best, predicted, finalists)
    if len(replayer.categories()) > 1:
        category_search(ctx, replayer, proxy, budget)
    if budget.spent():
        ctx.note("the n-gram proxy search stopped at its share of the time budget")
    return proxy


def category_search(ctx: TuneContext, replayer: Replayer, proxy: Proxy, budget) -> None:
    """Each category's best setting (either kind), from each kind's global winner, on the
    category's continuations alone."""
    space: NgramSpace = ctx.space
    for category in replayer.categories():
        indices = replayer.indices(category)
        found = {}
        for kind in KINDS:
            scored = Scored(functools.partial(replayer.speedup, indices=indices))
            config = ascend(
                proxy.best[kind], grids(space, kind), scored, space.search.passes, budget.spent
            )
            found[config] = scored(config)
        own = max(found, key=lambda c: found[c])
        proxy.by_category[category] = own
        proxy.rows[category] = {
            "best": block_of(own).model_dump(),
            "predicted_speedup": round(found[own], 4),
            "global_predicted": {
                k: round(replayer.speedup(proxy.best[k], indices), 4) for k in KINDS
            },
        }


# --- measured ------------------------------------------------------------------------------


def measured_study(
    ctx: TuneContext, proxy: Proxy, prompts: list[EncodedPrompt], replayer: Replayer
) -> tuple[dict[str, Config], str | None, list[dict]]:
    """Each kind's fastest measured setting (the proxy's best where its study finished no
    trial of that kind), the study's name, and its trials. Every trial is first scored on
    the proxy (``replayer``): one predicted below ``study.proxy_screen`` of the proxy's
    best is pruned before it decodes."""
    import optuna

    from autotune.methods.ngram import trials as ngram_trials

    space: NgramSpace = ctx.space
    wanted = ctx.trials if ctx.trials is not None else space.study.trials
    if wanted == 0:
        return dict(proxy.best), None, []
    # the proxy's finalists, then the engines' defaults (measured like any setting: the
    # chosen one is the faster of them on the study's prompts)
    starts = [start_config(space, kind) for kind in KINDS]
    seeds = [ngram_trials.params_from_config(c, space) for c in proxy.finalists + starts]
    seeds = [dict(s) for s in dict.fromkeys(tuple(sorted(s.items())) for s in seeds)]
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
        budget=ctx.budget.share(plan.NGRAM_STUDY_SHARE),
        label="n-gram study (measured)",
        objective_text="measured speedup",
    )
    done = completed(study)
    pruned = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.PRUNED,))
    screened = sum(len(t.intermediate_values) <= 1 for t in pruned)
    say(
        f"n-gram study: {len(done)} trials decoded every prompt, {len(pruned)} were pruned "
        f"({screened} on the proxy, before decoding)"
    )
    if not done:
        ctx.note("the n-gram study finished no trial in time: the proxy's best are measured")
    winners = {}
    for kind in KINDS:
        mine = [t for t in done if t.params.get("kind") == kind]
        best = max(mine, key=lambda t: t.value).params if mine else None
        winners[kind] = ngram_trials.config_from_params(best) if best else proxy.best[kind]
    rows = sorted(
        ({**t.params, "speedup": round(t.value, 4)} for t in done),
        key=lambda row: -row["speedup"],
    )
    return winners, study.study_name, rows


def tuning_seconds(space: NgramSpace, forward_s: float, trials: int) -> float:
    """About how long ``tune`` takes to finish ``trials`` whole trials (after the probe,
    whose proxy search it reuses): a whole trial decodes ``study.prompts`` prompts at
    about ``plan.DRAFT_FREE_COST`` of greedy's time; each one is accompanied by the
    trials ASHA prunes at its rung (two for each one promoted, each ``study.grace``
    prompts long) and by greedy re-timing (every prompt, once its timing is old); every
    trial starts its worker's decoding and warms up; greedy is timed on every prompt once
    first. The study is
    ``NGRAM_STUDY_SHARE`` of the time, the side by side after it the rest."""
    from autotune.measure.shared_greedy import RETIME_AFTER_S
    from autotune.methods.studies import REDUCTION_FACTOR

    prompt_s = space.trials.tokens * forward_s
    study = space.study
    whole = study.prompts * prompt_s * plan.DRAFT_FREE_COST + TRIAL_START_S
    pruned = min(study.grace, study.prompts) * prompt_s * plan.DRAFT_FREE_COST + TRIAL_START_S
    # re-timing: each prompt once its timing is RETIME_AFTER_S old
    retiming = 1 + study.prompts * prompt_s / RETIME_AFTER_S
    per_whole = (whole + (REDUCTION_FACTOR - 1) * pruned) * retiming
    seconds = trials * per_whole + study.prompts * prompt_s
    return seconds / plan.NGRAM_STUDY_SHARE


# What a trial costs besides its decoding: Tune starting it, the drafter's warm-up (2
# cores: whole trials took 19-22 s for 14 s of decoding, pruned 7-12 s for 6).
TRIAL_START_S = 1.5


def prompts_id(prompts: list[EncodedPrompt]) -> str:
    return hashlib.sha256(repr([p.ids for p in prompts]).encode()).hexdigest()[:8]


def with_default(space: NgramSpace, winners: dict[str, Config]) -> dict[str, Config]:
    """Each kind's winner and, unless it is one of them, the default the search started
    from (transformers' prompt lookup): the setting never measures slower than it."""
    default = start_config(space, "ngram")
    if default in winners.values():
        return dict(winners)
    return {**winners, "default": default}


def side_by_side(
    ctx: TuneContext,
    candidates: dict[str, Config],
    by_category: dict[str, Config],
    prompts: list[EncodedPrompt],
) -> tuple[str, dict[str, float], dict[str, dict], Figures, dict[str, Measurement]]:
    """The fastest candidate, each one's speedup, the verdict on every category's own
    setting, the chosen one's figures and every measurement: all decoded side by side on
    the same search prompts."""
    space: NgramSpace = ctx.space
    variants = {k: Variant(functools.partial(NgramDrafter, c)) for k, c in candidates.items()}
    if by_category:
        variants["per_category"] = Variant(
            variants["ngram"].make,
            {c: functools.partial(NgramDrafter, config) for c, config in by_category.items()},
        )
    label = "n-gram: the candidates and per-category settings side by side (search prompts)"
    with step(label, len(prompts) * len(variants)) as advance:
        measured = measure_variants(
            ctx.workspace.runner,
            variants,
            prompts,
            space.trials.tokens,
            on_prompt=lambda _: advance(),
            until=ctx.budget,
        )
    if any(m.lossless is False for m in measured.values()):
        raise AutotuneError(
            "n-gram drafting changed the greedy output, which it must never do: please "
            "report this as a bug (with the model and prompts)"
        )
    selection = {k: round(measured[k].speedup, 4) for k in candidates}
    chosen = max(candidates, key=lambda k: selection[k])  # a tie keeps the earlier
    verdicts = {}
    if by_category:
        verdicts = category_verdicts(
            measured["per_category"],
            measured[chosen],
            by_category,
            candidates[chosen],
            space.per_category,
        )
    # the chosen setting's figures: the profile's selection when no other method is left
    # to compare it with
    return chosen, selection, verdicts, Figures(**measured[chosen].summary(False)), measured


def category_verdicts(
    own: Measurement,
    chosen: Measurement,
    candidates: dict[str, Config],
    setting: Config,
    rule: PerCategory,
) -> dict[str, dict]:
    """Whether each category keeps its own setting: on its prompts, its own setting's
    speed over the chosen one's (paired by prompt) must be at least 1 + ``min_gain`` and
    the paired-bootstrap interval's low end above 1.0."""
    verdicts: dict[str, dict] = {}
    for category, config in candidates.items():
        if config == setting:
            verdicts[category] = {"kept": False, "why": "the same as the global setting"}
            continue
        rows = [
            (o.method_seconds, o.method_tokens, c.method_seconds, c.method_tokens)
            for o, c in zip(own.prompts, chosen.prompts)
            if o.category == category
        ]
        if not rows:
            verdicts[category] = {"kept": False, "why": "none of its prompts was measured"}
            continue
        pairs = Pairs.of(rows)
        gain, interval = pairs.speedup(), bootstrap_interval(pairs, rule.confidence)
        verdicts[category] = {
            "kept": bool(gain >= 1.0 + rule.min_gain and interval.above(1.0)),
            "speedup_vs_global": round(float(gain), 4),
            "interval": interval.as_list(),
            "prompts": len(rows),
            "setting": block_of(config).model_dump(),
        }
    return verdicts
