"""vLLM: the ``speculative_config`` of its V1 engine (``vllm serve --speculative-config``
or ``LLM(speculative_config=...)``): ``method``, ``model``, ``num_speculative_tokens``
and, for EAGLE, ``speculative_token_tree`` — a string of tuples whose node count equals
``num_speculative_tokens``. Written as YAML with the same dict as one-line JSON in a
comment, for the command line."""
from __future__ import annotations

import json

from autotune.export.base import (Exporter, Rendered, cape_warning, comment_lines, yaml_lines)
from autotune.engine.tree import check_tree
from autotune.export.choices import format_token_tree, is_chain
from autotune.engine.tree import chain_tree
from autotune.profile.schema import EagleMethod, MedusaMethod, Profile

TITLE = "vLLM"


def render(profile: Profile, method: str) -> Rendered:
    block = getattr(profile.methods, method)
    config, warnings, notes = (_eagle(block) if method == "eagle" else _medusa(block))
    lines = comment_lines(EXPORTER, profile, method, warnings, notes)
    lines.append(f"# command line: --speculative-config '{json.dumps(config)}'")
    lines += yaml_lines({"speculative_config": config})
    return Rendered("\n".join(lines) + "\n", warnings)


def _eagle(eagle: EagleMethod) -> tuple[dict, list[str], list[str]]:
    warnings, notes = [], []
    tree = _static_tree(eagle, warnings)
    config = {"method": "eagle", "model": eagle.head, "num_speculative_tokens": len(tree),
              "speculative_token_tree": format_token_tree(tree)}
    if not is_chain(tree):
        notes.append("a branching tree needs vLLM's tree attention backend (TREE_ATTN)")
    if eagle.draft_vocab:
        warnings.append(f"vLLM's EAGLE drafts over the whole vocabulary: the draft vocabulary "
                        f"of the head folder's {eagle.draft_vocab} most frequent tokens is not "
                        f"expressible (the output is the same; drafting costs more)")
    warnings += cape_warning(TITLE, eagle.cape)
    return config, warnings, notes


def _static_tree(eagle: EagleMethod, warnings: list[str]) -> list[tuple[int, ...]]:
    """vLLM drafts a fixed tree. A dynamic (EAGLE-2) profile is served by the static tree
    autotune measured beside it, else by a chain as deep as the dynamic tree reaches."""
    if eagle.tree.kind == "static":
        return check_tree(eagle.tree.choices)
    dyn = eagle.tree
    described = f"total_tokens={dyn.total_tokens}, depth={dyn.depth}, top_k={dyn.top_k}"
    static = eagle.alternatives.get("static", {})
    if static.get("tree", {}).get("kind") == "static":
        tree = check_tree(static["tree"]["choices"])
        speedup = static.get("measured", {}).get("speedup")
        measured = f", measured {speedup:.3f}x" if speedup is not None else ""
        nodes = f"{len(tree)} node{'s' if len(tree) != 1 else ''}"
        warnings.append(f"vLLM has no dynamic (EAGLE-2) tree; the profile's dynamic tree "
                        f"({described}) is replaced by the static tree autotune measured "
                        f"beside it ({nodes}{measured})")
        return tree
    # EAGLE-2 keeps total_tokens - 1 nodes over depth + 1 levels: a chain reaches no deeper
    length = min(dyn.depth + 1, dyn.total_tokens - 1)
    warnings.append(f"vLLM has no dynamic (EAGLE-2) tree; the profile's dynamic tree "
                    f"({described}) is approximated by a chain of {length} tokens")
    return chain_tree(length)


def _medusa(medusa: MedusaMethod) -> tuple[dict, list[str], list[str]]:
    warnings: list[str] = []
    depth = max(len(p) for p in medusa.tree)
    config = {"method": "medusa", "model": medusa.heads, "num_speculative_tokens": depth}
    if not is_chain(medusa.tree):
        warnings.append(f"vLLM's Medusa proposes each head's top-1 token, a chain: the tuned "
                        f"tree of {len(medusa.tree)} nodes is served as a chain of depth {depth}")
    typical = medusa.acceptance.typical
    if typical is not None:
        warnings.append(f"vLLM verifies sampled drafts by rejection sampling: Medusa's typical "
                        f"acceptance (eps {typical.eps}, delta {typical.delta}) is not "
                        f"expressible (greedy decoding is unaffected)")
    # vLLM's Medusa proposer stacks one top-1 token per head the checkpoint holds; the
    # profile does not know the folder's head count (the folder may be elsewhere), so say it
    notes = [f"vLLM drafts one token per head in the checkpoint: num_speculative_tokens "
             f"({depth}, the heads the tuned tree uses) must equal the head folder's "
             f"medusa_num_heads; serve a folder cut to {depth} head(s) if it holds more"]
    return config, warnings, notes


EXPORTER = Exporter(
    engine="vllm", title=TITLE,
    engine_version="vLLM >= 0.10 V1 engine, releases whose SpeculativeConfig has "
                   "speculative_token_tree",
    filename="vllm_speculative_config.yaml",
    methods=("eagle", "medusa"),
    cannot={"self_spec": "it drafts with a separate model or heads and cannot skip the "
                         "target's own sublayers (layer-skip self-speculation)"},
    render=render)
