"""The Medusa tree study's trials (run by Ray Tune workers): load the heads once per
process, build the tree a trial's parameters name, decode for real."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from autotune.drafters.medusa import MedusaDrafter
from autotune.measure.timing import EncodedPrompt
from autotune.methods.trial import measure_lossless
from autotune.models.ref import TargetRef
from autotune.process_cache import cached
from autotune.tuners.medusa_tree import grow_tree, positional_acceptance, sequoia_tree


def load_heads_for(target: TargetRef, heads_dir: str | Path):
    """The heads on the target's device, sharing its lm_head when they were trained with
    it frozen; loaded once per process (Ray workers keep them between trials)."""
    from autotune.heads.medusa import HeadsError, load_medusa_heads

    def build():
        runner = target.runner()
        heads = load_medusa_heads(heads_dir, runner.lm_head.weight, runner.dtype, runner.device)
        config = runner.config
        if (heads.hidden_size, heads.vocab_size) != (config.hidden_size, config.vocab_size):
            raise HeadsError(
                f"heads in {heads_dir} are for hidden size {heads.hidden_size} and "
                f"vocabulary {heads.vocab_size}; the model has {config.hidden_size} "
                f"and {config.vocab_size}: train heads for this model with "
                "`autotune heads train --kind medusa`"
            )
        return heads

    return cached(("medusa_heads", target, str(Path(heads_dir).resolve())), build)


def build_tree(
    path_accuracy: dict, builder: str, nodes: int, depth: int, max_rank: int
) -> list[tuple[int, ...]]:
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
    """A trial: measured speedup of the tree that (heads, nodes, builder) gives. Times wall
    clock, so trials must not share the machine's cores."""

    target: TargetRef
    heads_dir: str
    path_accuracy: dict
    max_rank: int
    prompts: list[EncodedPrompt]
    max_new_tokens: int

    def __call__(self, config: dict) -> dict:
        heads = load_heads_for(self.target, self.heads_dir)
        tree = build_tree(
            self.path_accuracy,
            config["builder"],
            int(config["nodes"]),
            int(config["num_heads"]),
            self.max_rank,
        )
        measured = measure_lossless(
            self.target,
            lambda: MedusaDrafter(heads, tree),
            self.prompts,
            self.max_new_tokens,
            "Medusa",
        )
        return {
            "objective": measured.speedup,
            "tree": [list(p) for p in tree],
            "tree_nodes": len(tree),
            "tree_depth": max(len(p) for p in tree),
            **measured.summary(),
        }
