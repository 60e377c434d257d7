"""Tune Medusa for this model and device: measure the heads, predict the best trees with
the verify-latency curve, confirm them by wall clock in a study, measure on held-back
prompts, and fit typical acceptance for sampling."""
from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path

import optuna

from autotune.drafters.medusa import MedusaDrafter
from autotune.engine.sampling import SamplingConfig
from autotune.engine.verify import TypicalAcceptance
from autotune.measure.costs import LatencyCurve
from autotune.measure.head_accuracy import HeadAccuracy, measure_head_accuracy, measure_head_costs
from autotune.measure.timing import Measurement, measure_side_by_side, measure_with_progress
from autotune.progress import say, step
from autotune.prompts import split_prompts
from autotune.models.ref import TargetRef
from autotune.process_cache import cached
from autotune.tuners.head_prompts import (confirm_and_calibration, heads_id,
                                          unseen_search_prompts)
from autotune.tuners.medusa_tree import (grow_tree, positional_acceptance, rank_tree_sizes,
                                         sequoia_sizes, sequoia_tree)
from autotune.tuners.space import MedusaSpace, TypicalSpace
from autotune.workspace import Workspace

MEDUSA_DEFAULT_TYPICAL = TypicalAcceptance(eps=0.09, delta=0.3)


def load_heads_for(target: TargetRef, heads_dir: str):
    """The heads on the target's device, sharing its lm_head when they were trained with
    it frozen; loaded once per process (Ray workers keep them between trials)."""
    from autotune.heads.medusa import HeadsError, load_medusa_heads

    def build():
        runner = target.runner()
        heads = load_medusa_heads(heads_dir, runner.lm_head.weight, runner.dtype, runner.device)
        config = runner.config
        if (heads.hidden_size, heads.vocab_size) != (config.hidden_size, config.vocab_size):
            raise HeadsError(f"heads in {heads_dir} are for hidden size {heads.hidden_size} and "
                             f"vocabulary {heads.vocab_size}; the model has {config.hidden_size} "
                             f"and {config.vocab_size}: train heads for this model with "
                             "`autotune heads train --kind medusa`")
        return heads

    return cached(("medusa_heads", target, str(Path(heads_dir).resolve())), build)


def build_tree(path_accuracy: dict, builder: str, nodes: int, depth: int,
               max_rank: int) -> list[tuple[int, ...]]:
    """The tree of at most ``nodes`` nodes and depth ``depth`` from one builder."""
    if not path_accuracy:
        return [(0,)]  # heads never right on calibration: the smallest tree
    if builder == "sequoia":
        tree = sequoia_tree(positional_acceptance(path_accuracy, max_rank), nodes, depth)
    else:
        tree = list(grow_tree(path_accuracy, nodes, depth)[:nodes])
    return tree or [(0,)]


@dataclass
class MedusaTreeObjective:
    """A Ray Tune trial: measured speedup of the tree that (heads, nodes, builder) gives.
    Times wall-clock, so trials must not share the machine's cores."""

    target: TargetRef
    heads_dir: str
    path_accuracy: dict
    max_rank: int
    prompts: list[tuple[str, list[int]]]
    max_new_tokens: int

    def __call__(self, config: dict) -> dict:
        heads = load_heads_for(self.target, self.heads_dir)
        tree = build_tree(self.path_accuracy, config["builder"], int(config["nodes"]),
                          int(config["num_heads"]), self.max_rank)
        measured = measure_side_by_side(self.target.runner(), lambda: MedusaDrafter(heads, tree),
                                        self.prompts, self.max_new_tokens)
        if measured.lossless is False:
            raise RuntimeError("Medusa output differed from plain greedy output")
        return {"objective": measured.speedup, "tree": [list(p) for p in tree],
                "tree_nodes": len(tree), "tree_depth": max(len(p) for p in tree),
                **measured.summary()}


@dataclass
class MedusaResult:
    tree: list[tuple[int, ...]]
    num_heads: int
    measured: Measurement
    study: str
    acceptance: dict
    accuracy: HeadAccuracy
    search: dict


def measure_tree(ws: Workspace, heads, tree, prompts, tokens: int, label: str) -> Measurement:
    return measure_with_progress(label, ws.runner, lambda: MedusaDrafter(heads, tree), prompts,
                                 tokens)


def predicted_candidates(accuracy: HeadAccuracy, curve: LatencyCurve, head_seconds: list[float],
                         space: MedusaSpace) -> list[dict]:
    """Every (heads, size, builder) ranked by predicted tokens per second: expected accepted
    tokens from the measured path accuracies over the measured step time."""
    acc = accuracy.path_accuracy
    draft = lambda depth: head_seconds[depth - 1]  # noqa: E731
    rows = []
    for depth in range(1, len(head_seconds) + 1):
        if "greedy" in space.tree.builders:
            order = grow_tree(acc, space.tree.max_nodes, depth)
            for size in rank_tree_sizes(order, acc, curve, draft):
                rows.append(("greedy", depth, size))
        if "sequoia" in space.tree.builders and acc:
            vector = positional_acceptance(acc, space.calibration.max_rank)
            for size in sequoia_sizes(vector, space.tree.max_nodes, depth, curve, draft, acc):
                rows.append(("sequoia", depth, size))
    rows.sort(key=lambda r: r[2].tokens_per_second, reverse=True)
    seen, out = set(), []
    for builder, depth, size in rows:
        # one candidate per distinct tree: head counts or builders past what a small
        # tree uses give the same tree, and measuring it twice is only noise
        key = tuple(sorted(tuple(p) for p in size.choices))
        if key in seen:
            continue
        seen.add(key)
        out.append({"builder": builder, "num_heads": depth, "nodes": size.nodes,
                    "depth": size.depth, "predicted_tokens_per_step":
                        round(size.expected_tokens_per_step, 4),
                    "predicted_speedup": round(size.tokens_per_second * curve(1), 4)})
    return out


@dataclass
class MedusaChoice:
    tree: list[tuple[int, ...]]
    study: str
    accuracy: HeadAccuracy
    search: dict


def tune_medusa(ws: Workspace, space: MedusaSpace, heads_dir: str, limits) -> MedusaResult:
    """Search on the search split, then measure on the held-back split."""
    choice = search_medusa(ws, space, heads_dir, limits)
    heads = load_heads_for(ws.ref, heads_dir)
    held = ws.encode(split_prompts(ws.prompts)[1])[: space.measure.confirm_prompts]
    measured = measure_tree(ws, heads, choice.tree, held, space.measure.confirm_tokens,
                            "medusa: held-back measurement")
    search = ws.encode(unseen_search_prompts(ws, heads_dir))
    acceptance = tune_typical(ws, heads, choice.tree, search[: space.typical.prompts],
                              space.typical)
    return MedusaResult(choice.tree, max(len(p) for p in choice.tree), measured, choice.study,
                        acceptance, choice.accuracy, choice.search)


def search_medusa(ws: Workspace, space: MedusaSpace, heads_dir: str, limits) -> MedusaChoice:
    """The tree (and so the head count) from the search split of the prompts only."""
    from autotune.studies.tune import StudySpec, run_study

    started = time.monotonic()
    heads = load_heads_for(ws.ref, heads_dir)
    name = ws.target.name
    search = ws.encode(unseen_search_prompts(ws, heads_dir, announce=True))
    # confirmation prompts are spread over the categories and kept out of calibration
    confirm, rest = confirm_and_calibration(search, space.tree.confirm_prompts)
    calibration = ws.continuations(rest[: space.calibration.prompts], space.calibration.tokens)

    heads_key = heads_id(heads_dir)

    def build_accuracy():
        with step("medusa: head accuracy on calibration decoding", len(calibration)) as advance:
            acc = measure_head_accuracy(ws.runner, heads, calibration, space.calibration.max_rank,
                                        progress=advance)
        return {"top_k": acc.top_k, "positions": acc.positions,
                "paths": [[list(p), v] for p, v in acc.path_accuracy.items()]}

    calibration_id = hashlib.sha256(repr(calibration).encode()).hexdigest()[:12]
    data = ws.cached_measurement("medusa_accuracy",
                                 f"{heads_key}/{calibration_id}/{space.calibration.max_rank}",
                                 build_accuracy, device_bound=False)
    accuracy = HeadAccuracy(data["top_k"], data["positions"],
                            {tuple(p): v for p, v in data["paths"]})
    say("medusa heads top-1: " + ", ".join(f"{a:.3f}" for a in accuracy.top1)
        + "; top-5: " + ", ".join(f"{a:.3f}" for a in accuracy.top5))
    curve = ws.verify_curve(space.tree.max_nodes + 1)
    head_seconds = measure_head_costs(ws.runner, heads)
    say(f"one target forward {curve(1) * 1e3:.1f} ms; heads (1..{heads.num_heads}) "
        + ", ".join(f"{s * 1e3:.1f}" for s in head_seconds) + " ms")

    candidates = predicted_candidates(accuracy, curve, head_seconds, space)
    seeds = [{k: c[k] for k in ("num_heads", "nodes", "builder")}
             for c in candidates[: space.tree.candidates]]
    study_name = f"{name}/medusa/{heads_key}"
    budget = limits.time_budget_s
    study = run_study(StudySpec(
        name=study_name, storage_url=ws.storage,
        space={"num_heads": optuna.distributions.IntDistribution(1, heads.num_heads),
               "nodes": optuna.distributions.IntDistribution(1, space.tree.max_nodes, log=True),
               "builder": optuna.distributions.CategoricalDistribution(space.tree.builders)},
        metric="objective", trials=space.tree.trials,
        sampler=optuna.samplers.TPESampler(seed=0, n_startup_trials=len(seeds)), seeds=seeds,
        # at least long enough for a trial or two: the calibration may have used it all
        time_budget_s=None if budget is None else max(60.0, budget - (time.monotonic() - started)),
        timed=True, threads=ws.hardware["threads"],
        user_attrs={"model": name, "fingerprint": ws.target.fingerprint, "method": "medusa",
                    "heads": str(Path(heads_dir).resolve()), "objective": "measured speedup"}),
        MedusaTreeObjective(ws.ref, str(Path(heads_dir).resolve()), accuracy.path_accuracy,
                            space.calibration.max_rank, confirm, space.tree.confirm_tokens),
        label="medusa tree study (measured)", workers=limits.workers)
    done = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    if done:
        best = max(done, key=lambda t: t.value)
        tree = [tuple(p) for p in best.user_attrs["tree"]]
    else:  # the time budget ran out first: keep the best prediction, and say so
        say(f"[yellow]the Medusa study {study_name} finished no trial within the time "
            "budget; keeping the best predicted tree[/yellow]")
        top = candidates[0] if candidates else {"builder": "greedy", "nodes": 1, "num_heads": 1}
        tree = build_tree(accuracy.path_accuracy, top["builder"], top["nodes"],
                          top["num_heads"], space.calibration.max_rank)
    search_info = {
        "trials": len(study.trials), "complete": len(done),
        "best_search_speedup": round(best.value, 4) if done else None,
        "head_top1": [round(a, 4) for a in accuracy.top1],
        "head_top5": [round(a, 4) for a in accuracy.top5],
        "head_seconds": [round(s, 5) for s in head_seconds],
        "predicted_top": candidates[:8],
        "measured_trials": sorted(
            ({"num_heads": t.params["num_heads"], "nodes": t.params["nodes"],
              "builder": t.params["builder"], "speedup": round(t.value, 4),
              "tree_nodes": t.user_attrs.get("tree_nodes")} for t in done),
            key=lambda r: r["speedup"], reverse=True),
        "verify_cost_relative": [round(v, 3) for v in curve.relative()],
        "seconds": round(time.monotonic() - started, 1),
    }
    return MedusaChoice(tree, study_name, accuracy, search_info)


def typical_statistics(ws: Workspace, heads, tree, prompts, rule: TypicalAcceptance,
                       sampling: SamplingConfig, tokens: int) -> dict:
    """Tokens per step and fidelity of typical acceptance, decoding for real.

    Fidelity: per emitted token, the overlap sum_x min(q(x), p(x)) between the
    distribution it was drawn from (a point mass for a typical-accepted node, the target
    itself for a bonus token) and the target's; exact speculative sampling scores 1.
    """
    from autotune.engine.decoding import decode_speculative
    from autotune.engine.sampling import probabilities

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
    for _, ids in prompts:
        result = decode_speculative(ws.runner, MedusaDrafter(heads, tree), ids, tokens, sampling,
                                    typical=rule, on_verify=record)
        steps += result.steps
        produced += len(result.tokens) - 1  # the first token comes from the prefill
    return {"eps": rule.eps, "delta": rule.delta,
            "tokens_per_step": round(produced / max(steps, 1), 4),
            "fidelity": round(overlap[0] / max(emitted[0], 1), 4)}


def tune_typical(ws: Workspace, heads, tree, prompts, space: TypicalSpace) -> dict:
    """Sweep (eps, delta); keep the pair with the longest accepted length whose fidelity
    is at least the floor (by default, that of Medusa's own 0.09 / 0.3)."""
    sampling = SamplingConfig(temperature=space.temperature, seed=0)
    pairs = [TypicalAcceptance(e, d) for e, d in space.pairs]
    if MEDUSA_DEFAULT_TYPICAL not in pairs:
        pairs.append(MEDUSA_DEFAULT_TYPICAL)
    rows = []
    with step("medusa: typical acceptance sweep", len(pairs)) as advance:
        for rule in pairs:
            rows.append(typical_statistics(ws, heads, tree, prompts, rule, sampling, space.tokens))
            advance()
    medusa = MEDUSA_DEFAULT_TYPICAL
    default = next(r for r in rows if (r["eps"], r["delta"]) == (medusa.eps, medusa.delta))
    floor = space.min_fidelity if space.min_fidelity is not None else default["fidelity"]
    allowed = [r for r in rows if r["fidelity"] >= floor - 1e-9] or [default]
    best = max(allowed, key=lambda r: (r["tokens_per_step"], r["fidelity"]))
    return {"greedy": "exact",
            "typical": {"eps": best["eps"], "delta": best["delta"],
                        "temperature": space.temperature, "min_fidelity": round(floor, 4),
                        "sweep": rows}}
