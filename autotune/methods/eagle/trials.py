"""The EAGLE tree studies' trials (run by Ray Tune workers): the head and draft
vocabularies loaded once per process, the tree a trial's parameters name, real decoding."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from autotune.drafters.eagle import DynamicTree, EagleDrafter, StaticTree
from autotune.heads.eagle import DraftProjection, load_draft_vocab
from autotune.measure.eagle_accuracy import level_seconds
from autotune.measure.timing import EncodedPrompt
from autotune.methods.eagle.settings import tree_block
from autotune.methods.trial import measure_lossless
from autotune.models.ref import TargetRef
from autotune.process_cache import cached
from autotune.tuners.medusa_tree import grow_tree


def load_head_for(target: TargetRef, head_dir: str | Path):
    """The head on the target's device; loaded once per process (Ray workers keep it)."""
    from autotune.heads.eagle import load_eagle_head

    def build():
        runner = target.runner()
        return load_eagle_head(head_dir, runner.config, runner.dtype, runner.device)

    return cached(("eagle_head", target, str(Path(head_dir).resolve())), build)


def vocab_sizes(head_dir: str | Path, wanted: list[int]) -> list[int]:
    """The draft-vocabulary sizes that apply to this head (0 = the whole vocabulary):
    sizes past the head's ranked token list are clipped to it."""
    ranked = load_draft_vocab(head_dir)
    if not ranked:
        return [0]
    return sorted({0 if size == 0 else min(size, len(ranked)) for size in wanted} | {0})


def projection_for(target: TargetRef, head_dir: str | Path, size: int) -> DraftProjection:
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


def make_tree(kind: str, params: dict, path_accuracy: dict) -> StaticTree | DynamicTree:
    """The tree a trial's parameters name."""
    if kind == "static":
        return StaticTree(static_tree(path_accuracy, int(params["nodes"]), int(params["depth"])))
    return DynamicTree(int(params["total_tokens"]), int(params["depth"]), int(params["top_k"]))


def tree_nodes(tree: StaticTree | DynamicTree) -> int:
    """Draft tokens verified per step (the dynamic tree's budget; it may keep fewer)."""
    return len(tree.choices) if isinstance(tree, StaticTree) else tree.total_tokens - 1


@dataclass
class EagleTreeObjective:
    """A trial: measured speedup of the tree a config gives (``kind`` fixed per study).
    Times wall clock, so trials must not share the machine's cores."""

    target: TargetRef
    head_dir: str
    kind: str
    path_accuracy: dict  # draft-vocabulary size -> path accuracy
    prompts: list[EncodedPrompt]
    max_new_tokens: int

    def __call__(self, config: dict) -> dict:
        head = load_head_for(self.target, self.head_dir)
        vocab = int(config["vocab"])
        tree = make_tree(self.kind, config, self.path_accuracy[vocab])
        projection = projection_for(self.target, self.head_dir, vocab)
        measured = measure_lossless(
            self.target,
            lambda: EagleDrafter(head, tree, projection),
            self.prompts,
            self.max_new_tokens,
            "EAGLE",
        )
        return {
            "objective": measured.speedup,
            "tree": tree_block(tree).model_dump(),
            "tree_nodes": tree_nodes(tree),
            **measured.summary(),
        }
