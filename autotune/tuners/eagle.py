"""Tune EAGLE for this model and device: (a) a static tree grown from the head's measured
path accuracies, sized with the verify-latency curve and the measured cost of drafting;
(b) EAGLE-2's dynamic expansion (total_tokens, depth, top_k) searched on measured speed.
Both winners are measured on held-back prompts; the faster is kept, both are reported."""
from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path

import optuna

from autotune.drafters.eagle import DynamicTree, EagleDrafter, StaticTree
from autotune.engine import small_matmul
from autotune.measure.eagle_accuracy import level_seconds, measure_eagle_accuracy, \
    measure_level_costs
from autotune.measure.head_accuracy import HeadAccuracy
from autotune.measure.timing import Measurement, measure_side_by_side, measure_with_progress
from autotune.progress import say, step
from autotune.prompts import split_prompts
from autotune.studies.worker import TargetRef, cached
from autotune.tuners.head_prompts import (confirm_and_calibration, heads_id,
                                          unseen_search_prompts)
from autotune.tuners.medusa_tree import grow_tree, rank_prefixes
from autotune.tuners.space import EagleSpace
from autotune.workspace import Workspace


def load_head_for(target: TargetRef, head_dir: str):
    """The head on the target's device; loaded once per process (Ray workers keep it)."""
    from autotune.heads.eagle import load_eagle_head

    def build():
        runner = target.runner()
        head = load_eagle_head(head_dir, runner.config, runner.dtype, runner.device)
        small_matmul.enable(head)  # the target's own layers already take this path
        return head

    return cached(("eagle_head", target, str(Path(head_dir).resolve())), build)


def static_tree(path_accuracy: dict, nodes: int, depth: int) -> tuple[tuple[int, ...], ...]:
    """The first ``nodes`` nodes of the greedy best-first growth, at most ``depth`` deep."""
    tree = grow_tree(path_accuracy, nodes, depth)[:nodes] if path_accuracy else []
    return tuple(tuple(p) for p in tree) or ((0,),)


def static_draft_seconds(tree, costs: dict[int, float]) -> float:
    """One proposal of a static tree: the root's level (committed pairs and its logits),
    then one level per depth over the nodes that have children."""
    parents = {tuple(p[:-1]) for p in tree if len(p) > 1}
    depth = max(len(p) for p in tree)
    widths = [sum(1 for p in parents if len(p) == d) for d in range(1, depth)]
    return level_seconds(costs, 1) + sum(level_seconds(costs, w) for w in widths)


def make_tree(config: dict, path_accuracy: dict) -> StaticTree | DynamicTree:
    if config["kind"] == "static":
        return StaticTree(static_tree(path_accuracy, int(config["nodes"]), int(config["depth"])))
    return DynamicTree(int(config["total_tokens"]), int(config["depth"]), int(config["top_k"]))


def tree_settings(tree: StaticTree | DynamicTree) -> dict:
    """The profile's ``tree`` block."""
    if isinstance(tree, StaticTree):
        return {"kind": "static", "choices": [list(p) for p in tree.choices]}
    return {"kind": "dynamic", "total_tokens": tree.total_tokens, "depth": tree.depth,
            "top_k": tree.top_k}


@dataclass
class EagleTreeObjective:
    """A Ray Tune trial: measured speedup of the tree a config gives (``kind`` fixed per
    study). Times wall-clock, so trials must not share the machine's cores."""

    target: TargetRef
    head_dir: str
    kind: str
    path_accuracy: dict
    prompts: list[tuple[str, list[int]]]
    max_new_tokens: int

    def __call__(self, config: dict) -> dict:
        head = load_head_for(self.target, self.head_dir)
        tree = make_tree({**config, "kind": self.kind}, self.path_accuracy)
        measured = measure_side_by_side(self.target.runner(), lambda: EagleDrafter(head, tree),
                                        self.prompts, self.max_new_tokens)
        if measured.lossless is False:
            raise RuntimeError("EAGLE output differed from plain greedy output")
        return {"objective": measured.speedup, "tree": tree_settings(tree),
                **measured.summary()}


@dataclass
class EagleResult:
    tree: StaticTree | DynamicTree
    measured: Measurement
    alternatives: dict          # kind -> {tree, measured} of both winners, held-back
    studies: dict               # kind -> study name
    accuracy: HeadAccuracy
    search: dict


def measure_eagle_tree(ws: Workspace, head, tree, prompts, tokens: int, label: str) -> Measurement:
    return measure_with_progress(label, ws.runner, lambda: EagleDrafter(head, tree), prompts,
                                 tokens)


def tune_eagle(ws: Workspace, space: EagleSpace, head_dir: str, limits) -> EagleResult:
    """Search on the search split; measure both kinds' winners on the held-back split."""
    search = EagleSearch(ws, space, head_dir, limits)
    winners = search.run()
    head = load_head_for(ws.ref, head_dir)
    held = ws.encode(split_prompts(ws.prompts)[1])[: space.measure.confirm_prompts]
    measured = {kind: measure_eagle_tree(ws, head, tree, held, space.measure.confirm_tokens,
                                         f"eagle {kind} tree: held-back measurement")
                for kind, tree in winners.items()}
    best = max(measured, key=lambda kind: measured[kind].speedup)
    alternatives = {kind: {"tree": tree_settings(winners[kind]),
                           "measured": measured[kind].summary()} for kind in winners}
    return EagleResult(winners[best], measured[best], alternatives, search.studies,
                       search.accuracy, search.info)


class EagleSearch:
    """The two studies on the search split (prompts the head never trained on)."""

    def __init__(self, ws: Workspace, space: EagleSpace, head_dir: str, limits):
        self.ws, self.space, self.limits = ws, space, limits
        self.head_dir = str(Path(head_dir).resolve())
        self.head = load_head_for(ws.ref, self.head_dir)
        self.studies: dict[str, str] = {}
        self.info: dict = {}

    def run(self) -> dict[str, StaticTree | DynamicTree]:
        started = time.monotonic()
        space = self.space
        search = self.ws.encode(unseen_search_prompts(self.ws, self.head_dir, announce=True))
        self.confirm, rest = confirm_and_calibration(search, space.trials.confirm_prompts)
        self.accuracy = self._accuracy(rest[: space.calibration.prompts])
        say("eagle head top-1 by drafting step: "
            + ", ".join(f"{a:.3f}" for a in self.accuracy.top1)
            + "; top-5: " + ", ".join(f"{a:.3f}" for a in self.accuracy.top5))
        curve = self.ws.verify_curve(space.static.max_nodes + 1)
        costs = measure_level_costs(self.ws.runner, self.head)
        say(f"one target forward {curve(1) * 1e3:.1f} ms; a drafting level of 1 / 8 nodes "
            f"{costs[1] * 1e3:.1f} / {costs[8] * 1e3:.1f} ms")
        predicted = self._predicted_static(curve, costs)
        budget = self.limits.time_budget_s
        # the two studies share the time budget that calibration left
        left = None if budget is None else max(120.0, budget - (time.monotonic() - started))
        static_seeds = [{"depth": p["depth"], "nodes": p["nodes"]}
                        for p in predicted[: space.static.candidates]]
        static = self._study("static", {
            "depth": optuna.distributions.IntDistribution(1, space.calibration.max_depth),
            "nodes": optuna.distributions.IntDistribution(1, space.static.max_nodes, log=True)},
            static_seeds, space.static.trials, None if left is None else left * 0.4)
        dynamic_space = space.dynamic
        dynamic = self._study("dynamic", {
            "total_tokens": optuna.distributions.IntDistribution(*dynamic_space.total_tokens,
                                                                 log=True),
            "depth": optuna.distributions.IntDistribution(*dynamic_space.depth),
            "top_k": optuna.distributions.IntDistribution(*dynamic_space.top_k)},
            self._dynamic_seeds(static_seeds), dynamic_space.trials,
            None if left is None else left * 0.6)
        winners = {}
        for kind, (study, fallback) in {"static": (static, static_seeds[:1]),
                                        "dynamic": (dynamic, [])}.items():
            tree = self._best(kind, study, fallback)
            if tree is not None:
                winners[kind] = tree
        self.info.update({
            "head_top1": [round(a, 4) for a in self.accuracy.top1],
            "head_top5": [round(a, 4) for a in self.accuracy.top5],
            "level_seconds": {str(w): round(s, 5) for w, s in costs.items()},
            "verify_cost_relative": [round(v, 3) for v in curve.relative()],
            "predicted_static_top": predicted[:6],
            "seconds": round(time.monotonic() - started, 1)})
        return winners

    def _accuracy(self, calibration_prompts) -> HeadAccuracy:
        space = self.space.calibration
        calibration = self.ws.continuations(calibration_prompts, space.tokens)

        def build():
            with step("eagle: head accuracy along greedy decoding", len(calibration)) as advance:
                acc = measure_eagle_accuracy(self.ws.runner, self.head, calibration,
                                             space.max_depth, space.max_rank, progress=advance)
            return {"top_k": acc.top_k, "positions": acc.positions,
                    "paths": [[list(p), v] for p, v in acc.path_accuracy.items()]}

        key = hashlib.sha256(repr(calibration).encode()).hexdigest()[:12]
        data = self.ws.cached_measurement(
            "eagle_accuracy", f"{heads_id(self.head_dir)}/{key}/{space.max_depth}/{space.max_rank}",
            build, device_bound=False)
        return HeadAccuracy(data["top_k"], data["positions"],
                            {tuple(p): v for p, v in data["paths"]})

    def _predicted_static(self, curve, costs) -> list[dict]:
        """Static trees of every depth and size, ranked by predicted tokens per second."""
        acc = self.accuracy.path_accuracy
        rows, seen = [], set()
        for depth in range(1, self.space.calibration.max_depth + 1):
            order = grow_tree(acc, self.space.static.max_nodes, depth) if acc else [(0,)]
            rows += rank_prefixes(order, acc, curve,
                                  lambda tree: static_draft_seconds(tree, costs))
        rows.sort(key=lambda r: (-r.tokens_per_second, r.nodes))
        out = []
        for size in rows:
            key = tuple(sorted(size.choices))
            if key in seen:
                continue
            seen.add(key)
            out.append({"depth": size.depth, "nodes": size.nodes,
                        "predicted_tokens_per_step": round(size.expected_tokens_per_step, 4),
                        "predicted_speedup": round(size.tokens_per_second * curve(1), 4)})
        return out

    @staticmethod
    def _dynamic_seeds(static_seeds: list[dict]) -> list[dict]:
        """Dynamic trees shaped like the best predicted static ones: a chain, and two and
        three children per level."""
        seeds = []
        for seed in static_seeds[:2]:
            depth = max(seed["depth"] - 1, 0)
            seeds.append({"total_tokens": seed["depth"] + 1, "depth": depth, "top_k": 1})
            seeds.append({"total_tokens": max(seed["nodes"], 2) + 1, "depth": depth, "top_k": 2})
        seeds.append({"total_tokens": 8, "depth": 2, "top_k": 3})
        unique = []
        for seed in seeds:
            if seed not in unique:
                unique.append(seed)
        return unique

    def _study(self, kind: str, distributions: dict, seeds: list[dict], trials: int,
               budget: float | None):
        from autotune.studies.tune import StudySpec, run_study

        name = f"{self.ws.target.name}/eagle-{kind}/{heads_id(self.head_dir)}"
        self.studies[kind] = name
        tokens = self.space.trials.confirm_tokens
        return run_study(StudySpec(
            name=name, storage_url=self.ws.storage, space=distributions, metric="objective",
            trials=trials, seeds=seeds, time_budget_s=budget,
            sampler=optuna.samplers.TPESampler(seed=0, n_startup_trials=len(seeds)),
            cpus_per_trial=self.ws.hardware["threads"],
            user_attrs={"model": self.ws.target.name, "fingerprint": self.ws.target.fingerprint,
                        "method": "eagle", "tree_kind": kind, "head": self.head_dir,
                        "objective": "measured speedup"}),
            EagleTreeObjective(self.ws.ref, self.head_dir, kind, self.accuracy.path_accuracy,
                               self.confirm, tokens),
            label=f"eagle {kind}-tree study (measured)", ray_address=self.limits.ray_address,
            workers=1)

    def _best(self, kind: str, study, fallback: list[dict]):
        done = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
        self.info[f"{kind}_trials"] = sorted(
            ({**t.params, "speedup": round(t.value, 4),
              "tree_nodes": _nodes(t.user_attrs.get("tree"))} for t in done),
            key=lambda r: r["speedup"], reverse=True)
        if done:
            best = max(done, key=lambda t: t.value)
            return make_tree({**best.params, "kind": kind}, self.accuracy.path_accuracy)
        if fallback:  # the time budget ran out first: keep the best prediction, and say so
            say(f"[yellow]the EAGLE {kind}-tree study finished no trial within the time "
                "budget; keeping the best predicted tree[/yellow]")
            return make_tree({**fallback[0], "kind": kind}, self.accuracy.path_accuracy)
        say(f"[yellow]the EAGLE {kind}-tree study finished no trial within the time "
            "budget[/yellow]")
        return None


def _nodes(tree: dict | None) -> int | None:
    if not tree:
        return None
    return len(tree["choices"]) if tree["kind"] == "static" else tree["total_tokens"] - 1
