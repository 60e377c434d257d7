"""TensorRT-LLM: the LLM API's ``speculative_config`` (a YAML file for
``trtllm-serve --extra_llm_api_options`` or ``LLM(**yaml)``) and, in a comment, the tree
string of the older TensorRT engine flow (``examples/run.py --medusa_choices="..."``).

- Medusa: ``decoding_type: Medusa``, ``max_draft_len`` (the tree's node count),
  ``num_medusa_heads``, ``medusa_choices``.
- EAGLE, static tree: ``decoding_type: Eagle``, ``eagle_choices``; ``max_draft_len`` is
  the tree's depth and ``max_total_draft_tokens`` its node count.
- EAGLE, dynamic tree (EAGLE-2): ``use_dynamic_tree``, ``dynamic_tree_max_topK``,
  ``max_draft_len`` (draft layers) and ``max_total_draft_tokens`` (nodes kept, root not
  counted), which TensorRT-LLM bounds by ``max_draft_len <= it <= topK * max_draft_len``.
"""
from __future__ import annotations

from autotune.engine.tree import check_tree
from autotune.export.base import (Exporter, Flow, Rendered, cape_warning, comment_lines,
                                  yaml_lines)
from autotune.export.choices import format_choices, tree_depth
from autotune.profile.schema import EagleMethod, MedusaMethod, Profile

TITLE = "TensorRT-LLM"


def render(profile: Profile, method: str) -> Rendered:
    block = getattr(profile.methods, method)
    config, warnings, notes = _medusa(block) if method == "medusa" else _eagle(block)
    lines = comment_lines(EXPORTER, profile, method, warnings, notes)
    lines += yaml_lines({"speculative_config": config})
    return Rendered("\n".join(lines) + "\n", warnings)


def _medusa(medusa: MedusaMethod) -> tuple[dict, list[str], list[str]]:
    tree = check_tree(medusa.tree)
    choices = format_choices(tree)
    config = {"decoding_type": "Medusa", "max_draft_len": len(tree),
              "speculative_model_dir": medusa.heads, "num_medusa_heads": medusa.num_heads,
              "medusa_choices": Flow(choices)}
    warnings = []
    typical = medusa.acceptance.typical
    if typical is not None:
        warnings.append(f"TensorRT-LLM's Medusa has no typical-acceptance setting: eps "
                        f"{typical.eps}, delta {typical.delta} are not expressible (greedy "
                        f"decoding is unaffected)")
    notes = ["Medusa runs on the TensorRT engine backend, not the PyTorch backend",
             f"engine flow: trtllm-build --speculative_decoding_mode medusa "
             f"--max_draft_len {len(tree)}; examples/run.py --medusa_choices=\"{choices}\""]
    return config, warnings, notes


def _eagle(eagle: EagleMethod) -> tuple[dict, list[str], list[str]]:
    warnings: list[str] = []
    notes = ["EAGLE-1/2 heads (this head folder's layout) run on the TensorRT engine "
             "backend (examples/eagle); the PyTorch backend serves EAGLE-3 drafts"]
    if eagle.tree.kind == "static":
        tree = check_tree(eagle.tree.choices)
        choices = format_choices(tree)
        config = {"decoding_type": "Eagle", "max_draft_len": tree_depth(tree),
                  "max_total_draft_tokens": len(tree), "speculative_model_dir": eagle.head,
                  "eagle_choices": Flow(choices)}
        notes.append(f"engine flow: examples/run.py --eagle_choices=\"{choices}\"")
        notes.append("TensorRT-LLM marks eagle_choices (static trees) deprecated")
    else:
        config = _dynamic(eagle, warnings)
        notes.append(f"engine flow: examples/run.py --eagle_use_dynamic_tree "
                     f"--eagle_dynamic_tree_max_top_k {config['dynamic_tree_max_topK']}")
    if eagle.draft_vocab:
        warnings.append(f"TensorRT-LLM's EAGLE drafts over the whole vocabulary: the draft "
                        f"vocabulary of the head folder's {eagle.draft_vocab} most frequent "
                        f"tokens is not expressible (same output, slower drafting)")
    warnings += cape_warning(TITLE, eagle.cape)
    return config, warnings, notes


def _dynamic(eagle: EagleMethod, warnings: list[str]) -> dict:
    dyn = eagle.tree
    # EAGLE-2 drafts depth + 1 levels and keeps total_tokens - 1 nodes (the root is the
    # last committed token); a level deeper than the nodes kept could never be used
    layers = min(dyn.depth + 1, dyn.total_tokens - 1)
    kept = dyn.total_tokens - 1
    bounded = min(max(kept, layers), dyn.top_k * layers)
    if bounded != kept:
        warnings.append(f"TensorRT-LLM keeps at most dynamic_tree_max_topK x max_draft_len = "
                        f"{dyn.top_k * layers} draft tokens: the profile's {kept} "
                        f"(total_tokens {dyn.total_tokens}) becomes {bounded}")
    return {"decoding_type": "Eagle", "max_draft_len": layers, "max_total_draft_tokens": bounded,
            "speculative_model_dir": eagle.head, "use_dynamic_tree": True,
            "dynamic_tree_max_topK": dyn.top_k}


EXPORTER = Exporter(
    engine="trtllm", title=TITLE,
    engine_version="TensorRT-LLM 1.x LLM API (speculative_config with max_total_draft_tokens) "
                   "and the TensorRT engine flow's --medusa_choices / --eagle_choices",
    filename="trtllm_extra_llm_api_options.yaml",
    methods=("medusa", "eagle"),
    cannot={"self_spec": "it drafts with heads or a separate draft model and cannot skip the "
                         "target's own sublayers (layer-skip self-speculation)"},
    render=render)
