"""Exports of an EAGLE profile.

- ``vllm``: the ``speculative_config`` of vLLM's V1 engine: ``method: eagle``, ``model``
  and ``num_speculative_tokens``. vLLM verifies one chain a step: it removed tree
  attention and ``speculative_token_tree`` (PR #42121), and its ``SpeculativeConfig``
  refuses unknown keys, so a tree is served as the chain of its depth (said in a warning).
  YAML, with the same dict as one-line JSON in a comment, for the command line.
- ``sglang``: the speculative flags of its server (``python -m sglang.launch_server``):
  ``--speculative-algorithm EAGLE``, ``--speculative-draft-model-path``,
  ``--speculative-num-steps`` (draft forward passes: the tree's depth),
  ``--speculative-eagle-topk`` (children kept per node and step) and
  ``--speculative-num-draft-tokens`` (tokens verified, the root included). SGLang grows
  its tree the EAGLE-2 way, so a dynamic profile maps onto it as it is; a static tree is
  approximated by the dynamic tree of the same depth, branching and size. A chain (topk
  1) with a schedule under load adds ``--speculative-adaptive`` and its config file, the
  export's companion (``export.load.sglang_adaptive_config``).
- ``trtllm``: TensorRT-LLM's LLM-API ``speculative_config``. Static tree: ``decoding_type:
  Eagle``, ``eagle_choices``; ``max_draft_len`` is the tree's depth and
  ``max_total_draft_tokens`` its node count. Dynamic tree (EAGLE-2): ``use_dynamic_tree``,
  ``dynamic_tree_max_topK``, ``max_draft_len`` (draft layers) and ``max_total_draft_tokens``
  (nodes kept, root not counted), which TensorRT-LLM bounds by ``max_draft_len <= it <=
  topK * max_draft_len``.
"""

from __future__ import annotations

import json

from autotune.engine.tree import chain_tree, check_tree
from autotune.export.base import Companion, Deployment, Flow, Rendered, cape_warning, json_text
from autotune.export.choices import (
    format_choices,
    is_chain,
    max_branching,
    tree_depth,
)
from autotune.export.load import load_note, sglang_adaptive_config, unmeasured_above_warning
from autotune.methods.eagle.settings import DynamicEagleTree, EagleSettings
from autotune.methods.export_common import engine_exporter, flags_file, trtllm_file, vllm_file


def render_vllm(d: Deployment) -> Rendered:
    config, warnings, notes = _vllm_config(d.settings)
    return vllm_file(VLLM, d, config, warnings, notes, "eagle")


def _vllm_config(eagle: EagleSettings) -> tuple[dict, list[str], list[str]]:
    warnings: list[str] = []
    notes: list[str] = []
    tree = _static_tree(eagle, warnings)
    depth = tree_depth(tree)
    config = {"method": "eagle", "model": eagle.head, "num_speculative_tokens": depth}
    if not is_chain(tree):
        warnings.append(
            f"vLLM verifies one chain per step (it removed tree attention and "
            f"speculative_token_tree, PR #42121): the tuned tree of {len(tree)} nodes is "
            f"served as a chain of its depth, {depth} tokens, each the head's top-1 guess, "
            f"so fewer tokens are accepted per step than were measured"
        )
    if eagle.draft_vocab:
        warnings.append(
            _whole_vocabulary(
                "vLLM", eagle.draft_vocab, "the output is the same; drafting costs more"
            )
        )
    warnings += cape_warning("vLLM", eagle.cape)
    return config, warnings, notes


def _whole_vocabulary(title: str, draft_vocab: int, cost: str) -> str:
    """An engine without the head folder's draft vocabulary (``cost``: what that costs)."""
    return (
        f"{title}'s EAGLE drafts over the whole vocabulary: the draft vocabulary of the head "
        f"folder's {draft_vocab} most frequent tokens is not expressible ({cost})"
    )


def _static_tree(eagle: EagleSettings, warnings: list[str]) -> list[tuple[int, ...]]:
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
        warnings.append(
            f"vLLM has no dynamic (EAGLE-2) tree; the profile's dynamic tree "
            f"({described}) is replaced by the static tree autotune measured "
            f"beside it ({nodes}{measured})"
        )
        return tree
    # EAGLE-2 keeps total_tokens - 1 nodes over depth + 1 levels: a chain reaches no deeper
    length = min(dyn.depth + 1, dyn.total_tokens - 1)
    warnings.append(
        f"vLLM has no dynamic (EAGLE-2) tree; the profile's dynamic tree "
        f"({described}) is approximated by a chain of {length} tokens"
    )
    return chain_tree(length)


def render_sglang(d: Deployment) -> Rendered:
    eagle: EagleSettings = d.settings
    warnings: list[str] = []
    notes = ["append these flags to: python -m sglang.launch_server --model-path MODEL"]
    steps, topk, draft_tokens = _tree_flags(eagle, warnings)
    if eagle.draft_vocab:
        warnings.append(
            f"the draft vocabulary (the head folder's {eagle.draft_vocab} most "
            f"frequent tokens, draft_vocab.json) is not passed: SGLang's "
            f"--speculative-token-map takes its own table file of hot token ids; "
            f"without one SGLang drafts over the whole vocabulary (same output, "
            f"slower drafting)"
        )
    warnings += cape_warning("SGLang", eagle.cape)
    flags: list[tuple[str, object]] = [
        ("--speculative-algorithm", "EAGLE"),
        ("--speculative-draft-model-path", eagle.head),
        ("--speculative-num-steps", steps),
        ("--speculative-eagle-topk", topk),
        ("--speculative-num-draft-tokens", draft_tokens),
    ]
    companion = _adaptive_schedule(eagle, steps, topk, warnings, notes)
    if companion is not None:
        flags += [("--speculative-adaptive", None), ("--speculative-adaptive-config", ADAPTIVE)]
    return flags_file(SGLANG, d, warnings, notes, flags, companion=companion)


# the adaptive schedule's file, as the flags name it until the export is written beside it
ADAPTIVE = "sglang_adaptive_schedule.json"


def _adaptive_schedule(
    eagle: EagleSettings, steps: int, topk: int, warnings: list[str], notes: list[str]
) -> Companion | None:
    """The schedule under load as SGLang's adaptive config (EAGLE chains: topk 1)."""
    config = sglang_adaptive_config(eagle.load, steps)
    if config is None:
        return None
    notes += [n for n in [load_note(eagle.load, "SGLang")] if n]
    if topk != 1:
        warnings.append(
            f"SGLang's adaptive schedule (--speculative-adaptive) serves EAGLE with topk 1 "
            f"only; this tree drafts topk {topk}: the schedule under load is not written"
        )
        return None
    warnings += unmeasured_above_warning(eagle.load, "SGLang")
    notes.append(
        f"{ADAPTIVE}: the draft steps per batch size measured under load (0: speculation "
        f"off); a batch takes the largest key at or below its size, after CUDA-graph "
        f"padding; one candidate a slot, so SGLang keeps the measured schedule: "
        f"{json.dumps(config)}"
    )
    return Companion(ADAPTIVE, ".adaptive.json", json_text(config))


def _tree_flags(eagle: EagleSettings, warnings: list[str]) -> tuple[int, int, int]:
    """(num_steps, eagle_topk, num_draft_tokens) for the profile's tree."""
    if eagle.tree.kind == "dynamic":
        dyn = eagle.tree
        # EAGLE-2 drafts depth + 1 levels but keeps only total_tokens - 1 nodes: a level
        # deeper than that could never be kept, so SGLang need not draft it
        return min(dyn.depth + 1, dyn.total_tokens - 1), dyn.top_k, dyn.total_tokens
    tree = check_tree(eagle.tree.choices)
    flags = tree_depth(tree), max_branching(tree), len(tree) + 1
    if not is_chain(tree):
        warnings.append(
            f"SGLang has no static tree: the tuned tree of {len(tree)} nodes is "
            f"approximated by its dynamic tree of the same depth ({flags[0]}), "
            f"branching ({flags[1]}) and size ({flags[2]} tokens verified)"
        )
    return flags


def render_trtllm(d: Deployment) -> Rendered:
    config, warnings, notes = _trtllm_config(d.settings)
    length = int(config.get("max_total_draft_tokens") or config.get("max_draft_len") or 1)
    return trtllm_file(TRTLLM, d, config, warnings, notes, length)


def _trtllm_config(eagle: EagleSettings) -> tuple[dict, list[str], list[str]]:
    warnings: list[str] = []
    notes = [
        "EAGLE-1/2 heads (this head folder's layout) run on the TensorRT engine "
        "backend (examples/eagle); the PyTorch backend serves EAGLE-3 drafts"
    ]
    if eagle.tree.kind == "static":
        tree = check_tree(eagle.tree.choices)
        choices = format_choices(tree)
        config = {
            "decoding_type": "Eagle",
            "max_draft_len": tree_depth(tree),
            "max_total_draft_tokens": len(tree),
            "speculative_model_dir": eagle.head,
            "eagle_choices": Flow(choices),
        }
        notes.append(f'engine flow: examples/run.py --eagle_choices="{choices}"')
        notes.append("TensorRT-LLM marks eagle_choices (static trees) deprecated")
    else:
        config = _dynamic(eagle, warnings)
        notes.append(
            f"engine flow: examples/run.py --eagle_use_dynamic_tree "
            f"--eagle_dynamic_tree_max_top_k {config['dynamic_tree_max_topK']}"
        )
    if eagle.draft_vocab:
        warnings.append(
            _whole_vocabulary("TensorRT-LLM", eagle.draft_vocab, "same output, slower drafting")
        )
    warnings += cape_warning("TensorRT-LLM", eagle.cape)
    return config, warnings, notes


def _dynamic(eagle: EagleSettings, warnings: list[str]) -> dict:
    dyn = eagle.tree
    assert isinstance(dyn, DynamicEagleTree)
    # EAGLE-2 drafts depth + 1 levels and keeps total_tokens - 1 nodes (the root is the
    # last committed token); a level deeper than the nodes kept could never be used
    layers = min(dyn.depth + 1, dyn.total_tokens - 1)
    kept = dyn.total_tokens - 1
    bounded = min(max(kept, layers), dyn.top_k * layers)
    if bounded != kept:
        warnings.append(
            f"TensorRT-LLM keeps at most dynamic_tree_max_topK x max_draft_len = "
            f"{dyn.top_k * layers} draft tokens: the profile's {kept} "
            f"(total_tokens {dyn.total_tokens}) becomes {bounded}"
        )
    return {
        "decoding_type": "Eagle",
        "max_draft_len": layers,
        "max_total_draft_tokens": bounded,
        "speculative_model_dir": eagle.head,
        "use_dynamic_tree": True,
        "dynamic_tree_max_topK": dyn.top_k,
    }


VLLM = engine_exporter("vllm", "speculative_config method eagle", render_vllm)
SGLANG = engine_exporter("sglang", "python -m sglang.launch_server --speculative-*", render_sglang)
TRTLLM = engine_exporter("trtllm", "LLM API EagleDecodingConfig", render_trtllm)

EXPORTERS = {e.engine: e for e in (VLLM, SGLANG, TRTLLM)}
CANNOT = {
    "hf": "its generate() has no EAGLE draft head",
    "llamacpp": "its EAGLE support (--spec-type draft-eagle3) takes EAGLE-3 drafts in GGUF, "
    "not EAGLE-1/2 heads",
    "dv": "it drafts only with the target's own layers skipped",
}
