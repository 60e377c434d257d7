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
from autotune.heads.eagle import DraftProjection, load_draft_vocab
from autotune.measure.eagle_accuracy import level_seconds, measure_eagle_accuracy, \
    measure_level_costs
from autotune.measure.head_accuracy import HeadAccuracy
from autotune.measure.timing import Measurement, measure_side_by_side, measure_with_progress
from autotune.progress import say, step
from autotune.prompts import split_prompts
from autotune.models.ref import TargetRef
from autotune.process_cache import cached
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
        return head

    return cached(("eagle_head", target, str(Path(head_dir).resolve())), build)


def vocab_sizes(head_dir: str, wanted: list[int]) -> list[int]:
    """The draft-vocabulary sizes that apply to this head (0 = the whole vocabulary):
    sizes past the head's ranked token list are clipped to it."""
    ranked = load_draft_vocab(head_dir)
    if not ranked:
        return [0]
    return sorted({0 if size == 0 else min(size, len(ranked)) for size in wanted} | {0})


def projection_for(target: TargetRef, head_dir: str, size: int) -> DraftProjection:
    """The lm_head over the head's ``size`` most frequent tokens (0: all), once per process."""
    def build():
        runner = target.runner()
        ranked = load_draft_vocab(head_dir) if size else None
        return DraftProjection(runner.lm_head, ranked[:size] if ranked else None)

    return cached(("eagle_projection", target, str(Path(head_dir).resolve()), size), build)


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


def tree_from_settings(settings: dict) -> StaticTree | DynamicTree:
    """The inverse of ``tree_settings``."""
    if settings["kind"] == "static":
        return StaticTree(tuple(tuple(p) for p in settings["choices"]))
    return DynamicTree(settings["total_tokens"], settings["depth"], settings["top_k"])


def tree_nodes(tree: StaticTree | DynamicTree) -> int:
    """Draft tokens verified per step (the dynamic tree's budget; it may keep fewer)."""
    return len(tree.choices) if isinstance(tree, StaticTree) else tree.total_tokens - 1


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
    path_accuracy: dict       # draft-vocabulary size -> path accuracy
    prompts: list[tuple[str, list[int]]]
    max_new_tokens: int

    def __call__(self, config: dict) -> dict:
        head = load_head_for(self.target, self.head_dir)
        vocab = int(config["vocab"])
        tree = make_tree({**config, "kind": self.kind}, self.path_accuracy[vocab])
        projection = projection_for(self.target, self.head_dir, vocab)
        measured = measure_side_by_side(self.target.runner(),
                                        lambda: EagleDrafter(head, tree, projection),
                                        self.prompts, self.max_new_tokens)
        if measured.lossless is False:
            raise RuntimeError("EAGLE output differed from plain greedy output")
        return {"objective": measured.speedup, "tree": tree_settings(tree),
                "tree_nodes": tree_nodes(tree), **measured.summary()}


@dataclass(frozen=True)
class EagleChoice:
    tree: StaticTree | DynamicTree
    vocab: int                # draft-vocabulary size, 0 = the whole vocabulary


@dataclass
class EagleResult:
    tree: StaticTree | DynamicTree
    vocab: int
    measured: Measurement
    alternatives: dict          # kind -> {tree, measured} of both winners, held-back
    studies: dict               # kind -> study name
    accuracy: HeadAccuracy
    search: dict


def measure_eagle_tree(ws: Workspace, head_dir: str, choice: EagleChoice, prompts, tokens: int,
                       label: str) -> Measurement:
    head = load_head_for(ws.ref, head_dir)
    projection = projection_for(ws.ref, head_dir, choice.vocab)
    return measure_with_progress(label, ws.runner,
                                 lambda: EagleDrafter(head, choice.tree, projection), prompts,
                                 tokens)


def tune_eagle(ws: Workspace, space: EagleSpace, head_dir: str, limits) -> EagleResult:
    """Search on the search split; measure both kinds' winners on the held-back split."""
    search = EagleSearch(ws, space, head_dir, limits)
    winners = search.run()
    held = ws.encode(split_prompts(ws.prompts)[1])[: space.measure.confirm_prompts]
    measured = {kind: measure_eagle_tree(ws, search.head_dir, choice, held,
                                         space.measure.confirm_tokens,
                                         f"eagle {kind} tree: held-back measurement")
                for kind, choice in winners.items()}
    best = max(measured, key=lambda kind: measured[kind].speedup)
    alternatives = {kind: {"tree": tree_settings(choice.tree), "draft_vocab": choice.vocab,
                           "measured": measured[kind].summary()}
                    for kind, choice in winners.items()}
    return EagleResult(winners[best].tree, winners[best].vocab, measured[best], alternatives,
                       search.studies, search.accuracy[0], search.info)


class EagleSearch:
    """The two studies on the search split (prompts the head never trained on)."""

    def __init__(self, ws: Workspace, space: EagleSpace, head_dir: str, limits):
        self.ws, self.space, self.limits = ws, space, limits
        self.head_dir = str(Path(head_dir).resolve())
        self.head = load_head_for(ws.ref, self.head_dir)
        self.vocabs = vocab_sizes(self.head_dir, space.calibration.draft_vocab)
        self.studies: dict[str, str] = {}
        self.info: dict = {}

    def run(self) -> dict[str, EagleChoice]:
        started = time.monotonic()
        space = self.space
        search = self.ws.encode(unseen_search_prompts(self.ws, self.head_dir, announce=True))
        self.confirm, rest = confirm_and_calibration(search, space.trials.confirm_prompts)
        calibration = self.ws.continuations(rest[: space.calibration.prompts],
                                            space.calibration.tokens)
        self.accuracy = {v: self._accuracy(calibration, v) for v in self.vocabs}
        curve = self.ws.verify_curve(space.static.max_nodes + 1)
        costs = {v: measure_level_costs(self.ws.runner, self.head,
                                        projection=projection_for(self.ws.ref, self.head_dir, v))
                 for v in self.vocabs}
        for v in self.vocabs:
            say(f"eagle head, draft vocabulary {v or 'all'}: top-1 by drafting step "
                + ", ".join(f"{a:.3f}" for a in self.accuracy[v].top1)
                + f"; a drafting level of 1 / 8 nodes {costs[v][1] * 1e3:.1f} / "
                f"{costs[v][8] * 1e3:.1f} ms")
        say(f"one target forward {curve(1) * 1e3:.1f} ms")
        predicted = self._predicted_static(curve, costs)
        budget = self.limits.time_budget_s
        # the two studies share the time budget that calibration left
        left = None if budget is None else max(120.0, budget - (time.monotonic() - started))
        vocab = optuna.distributions.CategoricalDistribution(self.vocabs)
        static_seeds = [{k: p[k] for k in ("depth", "nodes", "vocab")}
                        for p in predicted[: space.static.candidates]]
        static = self._study("static", {
            "depth": optuna.distributions.IntDistribution(1, space.calibration.max_depth),
            "nodes": optuna.distributions.IntDistribution(1, space.static.max_nodes, log=True),
            "vocab": vocab}, static_seeds, space.static.trials,
            None if left is None else left * 0.4)
        dynamic_space = space.dynamic
        dynamic = self._study("dynamic", {
            "total_tokens": optuna.distributions.IntDistribution(*dynamic_space.total_tokens,
                                                                 log=True),
            "depth": optuna.distributions.IntDistribution(*dynamic_space.depth),
            "top_k": optuna.distributions.IntDistribution(*dynamic_space.top_k),
            "vocab": vocab}, self._dynamic_seeds(static_seeds), dynamic_space.trials,
            None if left is None else left * 0.6)
        winners = {}
        for kind, (study, fallback) in {"static": (static, static_seeds[:1]),
                                        "dynamic": (dynamic, [])}.items():
            choice = self._best(kind, study, fallback)
            if choice is not None:
                winners[kind] = choice
        self.info.update({
            "draft_vocab": {str(v): {"top1": [round(a, 4) for a in self.accuracy[v].top1],
                                     "top5": [round(a, 4) for a in self.accuracy[v].top5],
                                     "level_seconds": {str(w): round(t, 5)
                                                       for w, t in costs[v].items()}}
                            for v in self.vocabs},
            "verify_cost_relative": [round(v, 3) for v in curve.relative()],
            "predicted_static_top": predicted[:6],
            "seconds": round(time.monotonic() - started, 1)})
        return winners

    def _accuracy(self, calibration, vocab: int) -> HeadAccuracy:
        space = self.space.calibration
        projection = projection_for(self.ws.ref, self.head_dir, vocab)

        def build():
            with step(f"eagle: head accuracy along greedy decoding (draft vocabulary "
                      f"{vocab or 'all'})", len(calibration)) as advance:
                acc = measure_eagle_accuracy(self.ws.runner, self.head, calibration,
                                             space.max_depth, space.max_rank, advance,
                                             projection)
            return {"top_k": acc.top_k, "positions": acc.positions,
                    "paths": [[list(p), v] for p, v in acc.path_accuracy.items()]}

        key = hashlib.sha256(repr(calibration).encode()).hexdigest()[:12]
        data = self.ws.cached_measurement(
            "eagle_accuracy",
            f"{heads_id(self.head_dir)}/{key}/{space.max_depth}/{space.max_rank}/{vocab}",
            build, device_bound=False)
        return HeadAccuracy(data["top_k"], data["positions"],
                            {tuple(p): v for p, v in data["paths"]})

    def _predicted_static(self, curve, costs) -> list[dict]:
        """Static trees of every vocabulary, depth and size, by predicted tokens per second."""
        rows = []
        for vocab in self.vocabs:
            acc = self.accuracy[vocab].path_accuracy
            for depth in range(1, self.space.calibration.max_depth + 1):
                order = grow_tree(acc, self.space.static.max_nodes, depth) if acc else [(0,)]
                rows += [(vocab, size) for size in rank_prefixes(
                    order, acc, curve, lambda tree: static_draft_seconds(tree, costs[vocab]))]
        rows.sort(key=lambda r: (-r[1].tokens_per_second, r[1].nodes))
        out, seen = [], set()
        for vocab, size in rows:
            key = (vocab, tuple(sorted(size.choices)))
            if key in seen:
                continue
            seen.add(key)
            out.append({"vocab": vocab, "depth": size.depth, "nodes": size.nodes,
                        "predicted_tokens_per_step": round(size.expected_tokens_per_step, 4),
                        "predicted_speedup": round(size.tokens_per_second * curve(1), 4)})
        return out

    @staticmethod
    def _dynamic_seeds(static_seeds: list[dict]) -> list[dict]:
        """Dynamic trees shaped like the best predicted static ones: a chain, and two and
        three children per level."""
        seeds = []
        for seed in static_seeds[:2]:
            depth, vocab = max(seed["depth"] - 1, 0), seed["vocab"]
            seeds.append({"total_tokens": seed["depth"] + 1, "depth": depth, "top_k": 1,
                          "vocab": vocab})
            seeds.append({"total_tokens": max(seed["nodes"], 2) + 1, "depth": depth, "top_k": 2,
                          "vocab": vocab})
        if static_seeds:
            seeds.append({"total_tokens": 8, "depth": 2, "top_k": 3,
                          "vocab": static_seeds[0]["vocab"]})
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
        paths = {v: acc.path_accuracy for v, acc in self.accuracy.items()}
        return run_study(StudySpec(
            name=name, storage_url=self.ws.storage, space=distributions, metric="objective",
            trials=trials, seeds=seeds, time_budget_s=budget,
            sampler=optuna.samplers.TPESampler(seed=0, n_startup_trials=len(seeds)),
            timed=True, threads=self.ws.hardware["threads"],
            user_attrs={"model": self.ws.target.name, "fingerprint": self.ws.target.fingerprint,
                        "method": "eagle", "tree_kind": kind, "head": self.head_dir,
                        "objective": "measured speedup"}),
            EagleTreeObjective(self.ws.ref, self.head_dir, kind, paths, self.confirm, tokens),
            label=f"eagle {kind}-tree study (measured)", workers=self.limits.workers)

    def _choice(self, kind: str, params: dict) -> EagleChoice:
        vocab = int(params["vocab"])
        return EagleChoice(make_tree({**params, "kind": kind},
                                     self.accuracy[vocab].path_accuracy), vocab)

    def _best(self, kind: str, study, fallback: list[dict]) -> EagleChoice | None:
        done = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
        done = [t for t in done if t.params.get("vocab") in self.vocabs]
        self.info[f"{kind}_trials"] = sorted(
            ({**t.params, "speedup": round(t.value, 4),
              "tree_nodes": t.user_attrs.get("tree_nodes")} for t in done),
            key=lambda r: r["speedup"], reverse=True)
        if done:
            return self._choice(kind, max(done, key=lambda t: t.value).params)
        if fallback:  # the time budget ran out first: keep the best prediction, and say so
            say(f"[yellow]the EAGLE {kind}-tree study finished no trial within the time "
                "budget; keeping the best predicted tree[/yellow]")
            return self._choice(kind, fallback[0])
        say(f"[yellow]the EAGLE {kind}-tree study finished no trial within the time "
            "budget[/yellow]")
        return None
