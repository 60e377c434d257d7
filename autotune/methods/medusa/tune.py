"""Tuning Medusa on the search split: measure the heads, predict the best trees with this
device's verify-latency curve, confirm them by wall clock in a study, and fit typical
acceptance for sampling."""

from __future__ import annotations

from typing import Any

from autotune.measure.costs import LatencyCurve
from autotune.measure.head_accuracy import HeadAccuracy, measure_head_accuracy, measure_head_costs
from autotune.methods import registry
from autotune.methods.base import TuneContext
from autotune.methods.heads import (
    cached_accuracy,
    confirm_and_calibration,
    heads_id,
    predicted_figures,
    unseen_search_prompts,
)
from autotune.methods.medusa.settings import MedusaAcceptance, MedusaSettings
from autotune.methods.medusa.space import MedusaSpace
from autotune.methods.medusa.trials import MedusaTreeObjective, build_tree, load_heads_for
from autotune.methods.medusa.typical import swept_pairs, tune_typical
from autotune.methods.studies import completed, run_method_study
from autotune.progress import say, step
from autotune.tuners.medusa_tree import (
    grow_tree,
    positional_acceptance,
    rank_tree_sizes,
    sequoia_sizes,
)


def tune(ctx: TuneContext) -> MedusaSettings:
    space: MedusaSpace = ctx.space
    ws = ctx.workspace
    heads_dir = str(ctx.heads)
    heads = load_heads_for(ws.ref, heads_dir)
    search = ws.encode(unseen_search_prompts(ws, heads_dir, announce=True))
    # trial prompts are spread over the categories and kept out of calibration
    confirm, rest = confirm_and_calibration(search, space.trials.prompts)
    calibration = ws.continuations(rest[: space.calibration.prompts], space.calibration.tokens)
    accuracy = head_accuracy(ctx, heads, calibration)
    curve = ws.verify_curve(space.tree.max_nodes + 1)
    head_seconds = measure_head_costs(ws.runner, heads)
    say(
        f"one target forward {curve(1) * 1e3:.1f} ms; heads (1..{heads.num_heads}) "
        + ", ".join(f"{s * 1e3:.1f}" for s in head_seconds)
        + " ms"
    )
    candidates = predicted_candidates(accuracy, curve, head_seconds, space)
    tree, study_info = tree_study(ctx, heads, accuracy, candidates, confirm)
    typical = tune_typical(
        ws, heads, tree, search[: space.typical.prompts], space.typical, until=ctx.budget
    )
    if len(typical.sweep) < (pairs := len(swept_pairs(space.typical))):
        ctx.note(
            f"typical acceptance: {len(typical.sweep)} of {pairs} (eps, delta) pairs swept in "
            "the time (Medusa's own pair first)"
        )
    return MedusaSettings(
        heads=heads_dir,
        num_heads=max(len(p) for p in tree),
        tree=[list(p) for p in tree],
        acceptance=MedusaAcceptance(typical=typical),
        study=study_info.pop("study"),
        search={
            **study_info,
            "head_top1": [round(a, 4) for a in accuracy.top1],
            "head_top5": [round(a, 4) for a in accuracy.top5],
            "head_seconds": [round(s, 5) for s in head_seconds],
            "predicted_top": candidates[:8],
            **ws.verify_record(curve),
            "seconds": round(ctx.budget.elapsed(), 1),
        },
    )


def head_accuracy(ctx: TuneContext, heads, calibration) -> HeadAccuracy:
    """Per-head and path accuracy along calibration decoding (cached: it does not depend
    on the device)."""
    ws, max_rank = ctx.workspace, ctx.space.calibration.max_rank

    def measure() -> HeadAccuracy:
        with step("medusa: head accuracy on calibration decoding", len(calibration)) as advance:
            return measure_head_accuracy(ws.runner, heads, calibration, max_rank, progress=advance)

    accuracy = cached_accuracy(
        ws, "medusa_accuracy", str(ctx.heads), calibration, str(max_rank), measure
    )
    say(
        "medusa heads top-1: "
        + ", ".join(f"{a:.3f}" for a in accuracy.top1)
        + "; top-5: "
        + ", ".join(f"{a:.3f}" for a in accuracy.top5)
    )
    return accuracy


def predicted_candidates(
    accuracy: HeadAccuracy, curve: LatencyCurve, head_seconds: list[float], space: MedusaSpace
) -> list[dict]:
    """Every distinct (heads, size, builder) tree ranked by predicted tokens per second:
    expected accepted tokens from the measured path accuracies over the measured step
    time."""
    acc = accuracy.path_accuracy

    def draft(depth: int) -> float:
        return head_seconds[depth - 1]

    rows = []
    for depth in range(1, len(head_seconds) + 1):
        if "greedy" in space.tree.builders:
            order = grow_tree(acc, space.tree.max_nodes, depth)
            rows += [("greedy", depth, size) for size in rank_tree_sizes(order, acc, curve, draft)]
        if "sequoia" in space.tree.builders and acc:
            vector = positional_acceptance(acc, space.calibration.max_rank)
            rows += [
                ("sequoia", depth, size)
                for size in sequoia_sizes(vector, space.tree.max_nodes, depth, curve, draft, acc)
            ]
    rows.sort(key=lambda r: r[2].tokens_per_second, reverse=True)
    seen, out = set(), []
    for builder, depth, size in rows:
        # one candidate per distinct tree: head counts or builders past what a small tree
        # uses give the same tree, and measuring it twice is only noise
        key = tuple(sorted(tuple(p) for p in size.choices))
        if key in seen:
            continue
        seen.add(key)
        out.append(
            {
                "builder": builder,
                "num_heads": depth,
                "nodes": size.nodes,
                "depth": size.depth,
                **predicted_figures(size, curve),
            }
        )
    return out


def tree_study(
    ctx: TuneContext, heads, accuracy: HeadAccuracy, candidates: list[dict], confirm
) -> tuple[list[tuple[int, ...]], dict]:
    """The best predicted trees first, then the sampler's, decoded for real on search
    prompts; the fastest tree (the best prediction when no trial finished in time)."""

    space: MedusaSpace = ctx.space
    seeds = [
        {k: c[k] for k in ("num_heads", "nodes", "builder")}
        for c in candidates[: space.tree.candidates]
    ]
    objective = MedusaTreeObjective(
        ctx.workspace.ref,
        str(ctx.heads),
        accuracy.path_accuracy,
        space.calibration.max_rank,
        confirm,
        space.trials.tokens,
    )
    study = run_method_study(
        ctx,
        f"medusa/{heads_id(str(ctx.heads))}",
        tree_distributions(space, heads.num_heads),
        objective,
        trials=ctx.trials or space.tree.trials,
        seeds=seeds,
        budget=ctx.budget.share(registry.time_share("medusa", "tree study")),
        label="medusa tree study (measured)",
        attrs={"heads": str(ctx.heads)},
    )
    return study_winner(ctx, study, accuracy, candidates), study_summary(study)


def tree_distributions(space: MedusaSpace, num_heads: int) -> dict:
    import optuna

    return {
        "num_heads": optuna.distributions.IntDistribution(1, num_heads),
        "nodes": optuna.distributions.IntDistribution(1, space.tree.max_nodes, log=True),
        "builder": optuna.distributions.CategoricalDistribution(space.tree.builders),
    }


def study_winner(
    ctx: TuneContext, study, accuracy: HeadAccuracy, candidates: list[dict]
) -> list[tuple[int, ...]]:
    """The study's fastest tree, or the best predicted one when no trial finished."""
    done = completed(study)
    if done:
        return [tuple(p) for p in max(done, key=lambda t: t.value).user_attrs["tree"]]
    ctx.note(
        f"the Medusa study {study.study_name} finished no trial within the time budget: "
        "keeping the best predicted tree"
    )
    top: dict[str, Any] = (
        candidates[0] if candidates else {"builder": "greedy", "nodes": 1, "num_heads": 1}
    )
    return build_tree(
        accuracy.path_accuracy,
        str(top["builder"]),
        int(top["nodes"]),
        int(top["num_heads"]),
        ctx.space.calibration.max_rank,
    )


def study_summary(study) -> dict:
    done = completed(study)
    measured = [
        {
            "num_heads": t.params["num_heads"],
            "nodes": t.params["nodes"],
            "builder": t.params["builder"],
            "speedup": round(t.value, 4),
            "tree_nodes": t.user_attrs.get("tree_nodes"),
        }
        for t in done
    ]
    return {
        "study": study.study_name,
        "trials": len(study.trials),
        "complete": len(done),
        "best_search_speedup": round(max(t.value for t in done), 4) if done else None,
        "measured_trials": sorted(measured, key=lambda r: r["speedup"], reverse=True),
    }
