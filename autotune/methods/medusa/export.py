"""Exports of a Medusa profile.

- ``vllm``: the ``speculative_config`` of vLLM's V1 engine (``vllm serve
  --speculative-config`` or ``LLM(speculative_config=...)``): ``method: medusa``,
  ``model``, ``num_speculative_tokens``; YAML, with the same dict as one-line JSON in a
  comment, for the command line.
- TensorRT-LLM is not served: the pinned release's LLM API has no Medusa decoding config
  (``tests/data/engines/trtllm.json``).
"""

from __future__ import annotations

from autotune.export import releases
from autotune.export.base import Deployment, Rendered
from autotune.export.choices import is_chain
from autotune.methods.export_common import engine_exporter, vllm_file
from autotune.methods.medusa.settings import MedusaSettings


def render_vllm(d: Deployment) -> Rendered:
    config, warnings, notes = _vllm_config(d.settings)
    return vllm_file(VLLM, d, config, warnings, notes, "medusa")


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


VLLM = engine_exporter("vllm", "speculative_config method medusa", render_vllm)
EXPORTERS = {e.engine: e for e in (VLLM,)}
CANNOT = {
    "trtllm": f"its LLM API has no Medusa decoding config ({releases.TRTLLM} has none; earlier "
    "releases served Medusa on the TensorRT engine backend only)",
    "sglang": "it has no Medusa heads (its speculative algorithms are EAGLE, EAGLE3, NEXTN, "
    "STANDALONE and NGRAM)",
    "hf": "its generate() has no Medusa heads",
    "llamacpp": "it has no Medusa heads",
    "dv": "it drafts only with the target's own layers skipped",
}
