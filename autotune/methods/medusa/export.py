"""Exports of a Medusa profile.

- ``vllm``: the ``speculative_config`` of vLLM's V1 engine (``vllm serve
  --speculative-config`` or ``LLM(speculative_config=...)``): ``method: medusa``,
  ``model``, ``num_speculative_tokens``; YAML, with the same dict as one-line JSON in a
  comment, for the command line.
- ``trtllm``: TensorRT-LLM's LLM-API ``speculative_config`` (a YAML file for
  ``trtllm-serve --extra_llm_api_options`` or ``LLM(**yaml)``): ``decoding_type: Medusa``,
  ``max_draft_len`` (the tree's node count), ``num_medusa_heads``, ``medusa_choices``; and
  in a comment the tree string of the older TensorRT engine flow
  (``examples/run.py --medusa_choices="..."``).
"""

from __future__ import annotations

from autotune.engine.tree import check_tree
from autotune.export.base import (
    Deployment,
    Exporter,
    Flow,
    Rendered,
    speculative_config,
)
from autotune.export.choices import format_choices, is_chain
from autotune.methods.medusa.settings import MedusaSettings


def render_vllm(d: Deployment) -> Rendered:
    config, warnings, notes = _vllm_config(d.settings)
    return speculative_config(VLLM, d, config, warnings, notes, command_line=True)


def _vllm_config(medusa: MedusaSettings) -> tuple[dict, list[str], list[str]]:
    warnings: list[str] = []
    depth = max(len(p) for p in medusa.tree)
    config = {"method": "medusa", "model": medusa.heads, "num_speculative_tokens": depth}
    if not is_chain(medusa.tree):
        warnings.append(
            f"vLLM's Medusa proposes each head's top-1 token, a chain: the tuned "
            f"tree of {len(medusa.tree)} nodes is served as a chain of depth {depth}"
        )
    typical = medusa.acceptance.typical
    if typical is not None:
        warnings.append(
            f"vLLM verifies sampled drafts by rejection sampling: Medusa's typical "
            f"acceptance (eps {typical.eps}, delta {typical.delta}) is not "
            f"expressible (greedy decoding is unaffected)"
        )
    # vLLM's Medusa proposer stacks one top-1 token per head the checkpoint holds; the
    # profile does not know the folder's head count (the folder may be elsewhere), so say it
    notes = [
        f"vLLM drafts one token per head in the checkpoint: num_speculative_tokens "
        f"({depth}, the heads the tuned tree uses) must equal the head folder's "
        f"medusa_num_heads; serve a folder cut to {depth} head(s) if it holds more"
    ]
    return config, warnings, notes


def render_trtllm(d: Deployment) -> Rendered:
    config, warnings, notes = _trtllm_config(d.settings)
    return speculative_config(TRTLLM, d, config, warnings, notes)


def _trtllm_config(medusa: MedusaSettings) -> tuple[dict, list[str], list[str]]:
    tree = check_tree(medusa.tree)
    choices = format_choices(tree)
    config = {
        "decoding_type": "Medusa",
        "max_draft_len": len(tree),
        "speculative_model_dir": medusa.heads,
        "num_medusa_heads": medusa.num_heads,
        "medusa_choices": Flow(choices),
    }
    warnings = []
    typical = medusa.acceptance.typical
    if typical is not None:
        warnings.append(
            f"TensorRT-LLM's Medusa has no typical-acceptance setting: eps "
            f"{typical.eps}, delta {typical.delta} are not expressible (greedy "
            f"decoding is unaffected)"
        )
    notes = [
        "Medusa runs on the TensorRT engine backend, not the PyTorch backend",
        f"engine flow: trtllm-build --speculative_decoding_mode medusa "
        f'--max_draft_len {len(tree)}; examples/run.py --medusa_choices="{choices}"',
    ]
    return config, warnings, notes


VLLM = Exporter(
    engine="vllm",
    engine_version="vLLM >= 0.10 V1 engine, releases whose SpeculativeConfig has "
    "speculative_token_tree",
    filename="vllm_speculative_config.yaml",
    render=render_vllm,
)
TRTLLM = Exporter(
    engine="trtllm",
    engine_version="TensorRT-LLM 1.x LLM API (speculative_config with max_total_draft_tokens) "
    "and the TensorRT engine flow's --medusa_choices / --eagle_choices",
    filename="trtllm_extra_llm_api_options.yaml",
    render=render_trtllm,
)

EXPORTERS = {e.engine: e for e in (VLLM, TRTLLM)}
CANNOT = {
    "sglang": "it has no Medusa heads (its speculative algorithms are EAGLE, EAGLE3, NEXTN, "
    "STANDALONE and NGRAM)",
    "hf": "its generate() has no Medusa heads",
    "llamacpp": "it has no Medusa heads",
    "dv": "it drafts only with the target's own layers skipped",
}
