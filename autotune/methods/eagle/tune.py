"""Tuning EAGLE on the search split: (a) a static tree grown from the head's measured path
accuracies, sized with the verify-latency curve and the measured cost of drafting; (b)
EAGLE-2's dynamic expansion (total_tokens, depth, top_k) searched on measured speed. The
two winners are then decoded side by side on search prompts and the faster is kept."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from autotune.drafters.eagle import DynamicTree, EagleDrafter, StaticTree
from autotune.measure.eagle_accuracy import measure_eagle_accuracy, measure_level_costs
from autotune.measure.head_accuracy import HeadAccuracy
from autotune.measure.timing import measure_variants
from autotune.methods import registry
from autotune.methods.base import TuneContext
from autotune.methods.eagle.settings import EagleSettings, tree_block
from autotune.methods.eagle.space import EagleSpace
from autotune.methods.eagle.trials import (
    EagleTreeObjective,
    load_head_for,
    make_tree,
    projection_for,
    static_draft_seconds,
    vocab_sizes,
)
from autotune.methods.heads import (
    cached_accuracy,
    confirm_and_calibration,
    heads_id,
    predicted_figures,
    unseen_search_prompts,
)
from autotune.methods.studies import completed, run_method_study
from autotune.progress import say, step
from autotune.tuners.medusa_tree import grow_tree, rank_prefixes


@dataclass(frozen=True)
class TreeChoice:
    tree: StaticTree | DynamicTree
    vocab: int  # draft-vocabulary size, 0 = the whole vocabulary


@dataclass
class Calibrated:
    """What the head's studies are steered by."""

    vocabs: list[int]
    accuracy: dict[int, HeadAccuracy]  # draft-vocabulary size -> accuracy
    level_costs: dict[int, dict[int, float]]
    confirm: list  # search prompts the trials decode


def tune(ctx: TuneContext) -> EagleSettings:
    head_dir = str(ctx.heads)
    calibrated = calibrate(ctx, head_dir)
    curve = ctx.workspace.verify_curve(ctx.space.static.max_nodes + 1)
    say(f"one target forward {curve(1) * 1e3:.1f} ms")
    predicted = predicted_static(ctx.space, calibrated, curve)
    winners, studies, trials = tree_studies(ctx, calibrated, predicted)
    kind, selection = finalist(ctx, head_dir, winners, calibrated.confirm)
    best = winners[kind]
    return EagleSettings(
        head=head_dir,
        tree=tree_block(best.tree),
        draft_vocab=best.vocab,
        study=studies,
        alternatives={
            k: {
                "tree": tree_block(c.tree).model_dump(),
                "draft_vocab": c.vocab,
                "search_speedup": selection.get(k),
            }
            for k, c in winners.items()
        },
        search={
            "draft_vocab": {
                str(v): {
                    "top1": [round(a, 4) for a in calibrated.accuracy[v].top1],
                    "top5": [round(a, 4) for a in calibrated.accuracy[v].top5],
                    "level_seconds": {
                        str(w): round(t, 5) for w, t in calibrated.level_costs[v].items()
                    },
                }
                for v in calibrated.vocabs
            },
            **ctx.workspace.verify_record(curve),
            "predicted_static_top": predicted[:6],
            "finalists_on_search_prompts": selection,
            **trials,
            "seconds": round(ctx.budget.elapsed(), 1),
        },
    )


def calibrate(ctx: TuneContext, head_dir: str) -> Calibrated:
    """The head's accuracy and drafting cost for every draft vocabulary, measured along
    greedy decoding of search prompts the head never trained on."""
    space: EagleSpace = ctx.space
    ws = ctx.workspace
    head = load_head_for(ws.ref, head_dir)
    vocabs = vocab_sizes(head_dir, space.calibration.draft_vocab)
    search = ws.encode(unseen_search_prompts(ws, head_dir, announce=True))
    confirm, rest = confirm_and_calibration(search, space.trials.prompts)
    calibration = ws.continuations(rest[: space.calibration.prompts], space.calibration.tokens)
    accuracy = {v: head_accuracy(ctx, head_dir, calibration, v) for v in vocabs}
    costs = {
        v: measure_level_costs(ws.runner, head, projection=projection_for(ws.ref, head_dir, v))
        for v in vocabs
    }
    for v in vocabs:
        say(
            f"eagle head, draft vocabulary {v or 'all'}: top-1 by drafting step "
            + ", ".join(f"{a:.3f}" for a in accuracy[v].top1)
            + f"; a drafting level of 1 / 8 nodes {costs[v][1] * 1e3:.1f} / "
            f"{costs[v][8] * 1e3:.1f} ms"
        )
    return Calibrated(vocabs, accuracy, costs, confirm)


def head_accuracy(ctx: TuneContext, head_dir: str, calibration, vocab: int) -> HeadAccuracy:
    """Per-step and path accuracy of the head's own extrapolation (cached: it does not
    depend on the device)."""
    ws, space = ctx.workspace, ctx.space.calibration
    head = load_head_for(ws.ref, head_dir)
    projection = projection_for(ws.ref, head_dir, vocab)

    def measure() -> HeadAccuracy:
        label = f"eagle: head accuracy along greedy decoding (draft vocabulary {vocab or 'all'})"
        with step(label, len(calibration)) as advance:
            return measure_eagle_accuracy(
                ws.runner, head, calibration, space.max_depth, space.max_rank, advance, projection
            )

    return cached_accuracy(
        ws,
        "eagle_accuracy",
        head_dir,
        calibration,
        f"{space.max_depth}/{space.max_rank}/{vocab}",
        measure,
    )


def predicted_static(space: EagleSpace, calibrated: Calibrated, curve) -> list[dict]:
    """Static trees of every vocabulary, depth and size, by predicted tokens per second."""
    rows = []
    for vocab in calibrated.vocabs:
        acc = calibrated.accuracy[vocab].path_accuracy
        costs = calibrated.level_costs[vocab]
        for depth in range(1, space.calibration.max_depth + 1):
            order = grow_tree(acc, space.static.max_nodes, depth) if acc else [(0,)]
            rows += [
                (vocab, size)
                for size in rank_prefixes(
                    order, acc, curve, functools.partial(static_draft_seconds, costs=costs)
                )
            ]
    rows.sort(key=lambda r: (-r[1].tokens_per_second, r[1].nodes))
    out, seen = [], set()
    for vocab, size in rows:
        key = (vocab, tuple(sorted(size.choices)))
        if key in seen:
            continue
        seen.add(key)
        out.append(
            {
                "vocab": vocab,
                "depth": size.depth,
                "nodes": size.nodes,
                **predicted_figures(size, curve),
            }
        )
    return out


@dataclass(frozen=True)
class TreeSearch:
    """One kind's study: its parameters, its first trials, its size and budget share."""

    distributions: dict
    seeds: list[dict]
    trials: int
    share: float


def tree_searches(
    space: EagleSpace, calibrated: Calibrated, predicted: list[dict]
) -> dict[str, TreeSearch]:
    """The static study starts from the best predicted trees; the dynamic one from
    expansions shaped like them."""
    from optuna.distributions import CategoricalDistribution, IntDistribution

    vocab = CategoricalDistribution(calibrated.vocabs)
    static_seeds = [
        {k: p[k] for k in ("depth", "nodes", "vocab")} for p in predicted[: space.static.candidates]
    ]
    dynamic = space.dynamic
    return {
        "static": TreeSearch(
            {
                "depth": IntDistribution(1, space.calibration.max_depth),
                "nodes": IntDistribution(1, space.static.max_nodes, log=True),
                "vocab": vocab,
            },
            static_seeds,
            space.static.trials,
            registry.time_share("eagle", "static tree study"),
        ),
        "dynamic": TreeSearch(
            {
                "total_tokens": IntDistribution(*dynamic.total_tokens, log=True),
                "depth": IntDistribution(*dynamic.depth),
                "top_k": IntDistribution(*dynamic.top_k),
                "vocab": vocab,
            },
            dynamic_seeds(static_seeds),
            dynamic.trials,
            registry.time_share("eagle", "dynamic tree study"),
        ),
    }


def tree_studies(
    ctx: TuneContext, calibrated: Calibrated, predicted: list[dict]
) -> tuple[dict[str, TreeChoice], dict[str, str], dict[str, list]]:
    """Each kind's winner (a static one predicted when its study finished no trial in
    time), each study's name, and each study's measured trials (``<kind>_trials``)."""
    winners, names, measured = {}, {}, {}
    for kind, search in tree_searches(ctx.space, calibrated, predicted).items():
        study = tree_study(ctx, calibrated, kind, search)
        names[kind] = study.study_name
        measured[f"{kind}_trials"] = sorted(
            (
                {
                    **t.params,
                    "speedup": round(t.value, 4),
                    "tree_nodes": t.user_attrs.get("tree_nodes"),
                }
                for t in completed(study)
            ),
            key=lambda r: r["speedup"],
            reverse=True,
        )
        fallback = search.seeds[:1] if kind == "static" else []
        choice = study_winner(ctx, calibrated, kind, study, fallback)
        if choice is not None:
            winners[kind] = choice
    return winners, names, measured


def tree_study(ctx: TuneContext, calibrated: Calibrated, kind: str, search: TreeSearch):

    head_dir = str(ctx.heads)
    paths = {v: acc.path_accuracy for v, acc in calibrated.accuracy.items()}
    return run_method_study(
        ctx,
        f"eagle-{kind}/{heads_id(head_dir)}",
        search.distributions,
        EagleTreeObjective(
            ctx.workspace.ref, head_dir, kind, paths, calibrated.confirm, ctx.space.trials.tokens
        ),
        trials=search.trials,
        seeds=search.seeds,
        budget=ctx.budget.share(search.share),
        label=f"eagle {kind}-tree study (measured)",
        attrs={"tree_kind": kind, "head": head_dir},
    )


def dynamic_seeds(static_seeds: list[dict]) -> list[dict]:
    """Dynamic trees shaped like the best predicted static ones: a chain, and two and
    three children per level."""
    seeds = []
    for seed in static_seeds[:2]:
        depth, vocab = max(seed["depth"] - 1, 0), seed["vocab"]
        seeds.append(
            {"total_tokens": seed["depth"] + 1, "depth": depth, "top_k": 1, "vocab": vocab}
        )
        seeds.append(
            {"total_tokens": max(seed["nodes"], 2) + 1, "depth": depth, "top_k": 2, "vocab": vocab}
        )
    if static_seeds:
        seeds.append({"total_tokens": 8, "depth": 2, "top_k": 3, "vocab": static_seeds[0]["vocab"]})
    return [dict(s) for s in dict.fromkeys(tuple(sorted(s.items())) for s in seeds)]


def study_winner(
    ctx: TuneContext, calibrated: Calibrated, kind: str, study, fallback: list[dict]
) -> TreeChoice | None:
    done = [t for t in completed(study) if t.params.get("vocab") in calibrated.vocabs]
    if done:
        params = max(done, key=lambda t: t.value).params
    elif fallback:
        ctx.note(
            f"the EAGLE {kind}-tree study finished no trial within the time budget: "
            "keeping the best predicted tree"
        )
        params = fallback[0]
    else:
        ctx.note(f"the EAGLE {kind}-tree study finished no trial within the time budget")
        return None
    vocab = int(params["vocab"])
    return TreeChoice(make_tree(kind, params, calibrated.accuracy[vocab].path_accuracy), vocab)


def finalist(
    ctx: TuneContext, head_dir: str, winners: dict[str, TreeChoice], prompts
) -> tuple[str, dict[str, float]]:
    """The faster of the two kinds' winners, decoded side by side (fresh timings, not the
    studies' maxima) on search prompts; and the speedup each measured there."""
    if len(winners) == 1:
        return next(iter(winners)), {}
    ws = ctx.workspace
    head = load_head_for(ws.ref, head_dir)
    makers = {
        kind: functools.partial(
            EagleDrafter, head, choice.tree, projection_for(ws.ref, head_dir, choice.vocab)
        )
        for kind, choice in winners.items()
    }
    with step(
        "eagle: the two winners side by side (search prompts)", len(prompts) * len(makers)
    ) as advance:
        measured = measure_variants(
            ws.runner,
            makers,
            prompts,
            ctx.space.trials.tokens,
            on_prompt=lambda _: advance(),
            until=ctx.budget,
        )
    speedups = {kind: round(m.speedup, 4) for kind, m in measured.items()}
    return max(speedups, key=lambda kind: speedups[kind]), speedups


def chain_seconds(depth: int, costs: dict[int, float]) -> float:
    """Drafting a chain of ``depth`` with the head: its static tree's levels."""
    return static_draft_seconds([(0,) * d for d in range(1, depth + 1)], costs)
