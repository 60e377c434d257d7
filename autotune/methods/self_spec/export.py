"""Exports of a self-speculative profile.

- ``hf``: a transformers ``generation_config.json`` fragment for self-speculative decoding
  by early exit (``assistant_early_exit``: the model drafts with its first E layers, then
  its final norm and LM head), with ``num_assistant_tokens``,
  ``num_assistant_tokens_schedule`` and ``assistant_confidence_threshold``. How
  transformers reads them (checked in ``tests/test_export.py``, with the release
  installed): for early exit the draft length and confidence threshold come from the
  model's own generation config (``generation_config.json``,
  ``model.generation_config``); passed as arguments of
  ``generate()`` they are ignored (it then drafts 20 tokens with a 0.4 threshold, its
  defaults). With ``assistant_early_exit`` in the model's generation config too, the
  draft's own inner ``generate()`` inherits it and drafts by early exit again, nested a
  few levels deep: still exact, but slower. So the fragment holds all four keys, and its
  notes say to pass ``assistant_early_exit`` to ``generate()`` instead where that nesting
  matters.
- ``llamacpp``: the speculative-decoding flags of ``llama-server`` at the pinned release
  (``export.releases.LLAMACPP``): ``--spec-type draft-simple`` (without it the release
  loads the draft model and never drafts: its default type is ``none``),
  ``--spec-draft-n-max``, ``--spec-draft-n-min`` and ``--spec-draft-p-min`` (the older
  ``--draft-max`` / ``--draft-min`` are refused there). llama.cpp drafts with a separate
  draft model (``--spec-draft-model``); only the draft length and the confidence exit of
  the profile carry over, never its skip mask.
- ``dv``: Draft & Verify's (dilab-zju/self-speculative-decoding) ``skip_layers.json``,
  ``{"<model>": {"attention": [...], "mlp": [...]}}``, read as
  ``skip_layers[model]["attention"]`` and ``["mlp"]``. The draft-exit settings have no
  place in that file; they are arguments of its ``exact_self_speculative_generate``
  (``max_step_draft``, ``th_stop_draft``, ``auto_th_stop_draft``, ``auto_parameters``),
  given under ``"_autotune"`` with the warnings, a key its loader never reads.
"""

from __future__ import annotations

import json

from autotune.engine.skip import SkipMask
from autotune.export.base import (
    JSON_META_KEY,
    Deployment,
    Exporter,
    Rendered,
    about_text,
    cape_warning,
    json_meta,
    json_text,
    speedup_text,
)
from autotune.methods.export_common import engine_exporter, flags_file
from autotune.methods.self_spec.settings import Adaptive, SelfSpecSettings


def early_exit_layer(skip: SkipMask, num_layers: int) -> tuple[int, bool]:
    """The ``assistant_early_exit`` that best stands in for a skip mask, and whether it is
    exact.

    Early exit runs layers [0, E) whole and none after; a layer-skip draft runs every
    sublayer outside its mask, wherever they are. E is chosen to run as many sublayers as
    the mask keeps, so the draft costs the same: E = ceil(kept / 2), kept = 2L - |mask|,
    held within [1, L - 1]. It is exact when the mask is every sublayer of layers E.. L-1.
    (The other candidate rule, the first layer after which everything is skipped, is
    usually L itself for a searched mask — no draft at all.)"""
    kept = 2 * num_layers - skip.size
    exit_layer = min(max((kept + 1) // 2, 1), num_layers - 1)
    tail = range(exit_layer, num_layers)
    return exit_layer, skip == SkipMask.of(tail, tail)


def render_hf(d: Deployment) -> Rendered:
    spec: SelfSpecSettings = d.settings
    num_layers = d.model.num_layers
    skip = SkipMask.of(spec.skip.attention, spec.skip.mlp)
    exit_layer, exact = early_exit_layer(skip, num_layers)
    warnings = []
    if not exact:
        warnings.append(
            f"assistant_early_exit={exit_layer} approximates the skip mask (attention "
            f"{sorted(skip.attention)}, mlp {sorted(skip.mlp)}): it runs the first "
            f"{exit_layer} of {num_layers} layers, as many sublayers as the mask keeps "
            f"({2 * num_layers - skip.size} of {2 * num_layers}), so the draft costs the same "
            f"but differs; acceptance and speed will differ from the measured "
            f"{speedup_text(spec)} (the output stays exact), and models not trained "
            f"for early exit draft poorly from an intermediate layer"
        )
    adaptive = spec.draft.adaptive
    if adaptive is not None:
        warnings.append(
            f"transformers keeps assistant_confidence_threshold fixed when drafting by early "
            f"exit: {_adaptive_threshold(adaptive)} is not expressible; the threshold stays "
            f"at its initial {spec.draft.exit_threshold}"
        )
    warnings += cape_warning("transformers", spec.cape)
    fragment = {
        "assistant_early_exit": exit_layer,
        "num_assistant_tokens": spec.draft.max_tokens,
        "num_assistant_tokens_schedule": "constant",
        "assistant_confidence_threshold": spec.draft.exit_threshold,
    }
    about = about_text(HF, d, warnings, _hf_notes(exit_layer))
    return Rendered(json_text(fragment), warnings, about=about)


def _hf_notes(exit_layer: int) -> list[str]:
    return [
        "merge these keys into the model folder's generation_config.json (or set them "
        "on model.generation_config): for early exit transformers reads the draft length "
        "and threshold from the model's own generation config, not from arguments of "
        "generate()",
        f"with assistant_early_exit in the model's generation config "
        f"the draft's own generate() inherits it and nests early-exit drafting (exact, "
        f"slower); to avoid that, leave it out of generation_config.json and pass "
        f"assistant_early_exit={exit_layer} to generate()",
        # seen on 2026-11-27: 4.56.2, 5.16.1 and 5.17.0 (the GPU image's) fail with a
        # threshold above 0 and decode exactly with 0; 4.57.6 fails with either; 5.18.0 and
        # later decode exactly; the exit layer passed to generate() decodes in every one
        "before transformers 5.18, generate() can fail when the model's generation config "
        "holds assistant_early_exit: a TypeError in ConfidenceCriteria with an "
        "assistant_confidence_threshold above 0 (seen in 4.56, 5.16 and 5.17), a "
        "ValueError about MinLengthLogitsProcessor with any threshold (seen in 4.57): "
        "there, pass assistant_early_exit to generate() as above, or upgrade transformers",
        "num_assistant_tokens_schedule is constant: the draft length is a fixed cap; "
        "the confidence threshold ends each draft early",
        "transformers keeps the draft token whose confidence fell below the threshold "
        "(autotune's drafter leaves it out), so its drafts run one token longer",
    ]


def _adaptive_threshold(adaptive: Adaptive) -> str:
    """Draft & Verify's adaptive threshold, for a warning that an engine lacks it."""
    return (
        f"Draft & Verify's adaptive threshold (target acceptance {adaptive.target_acceptance}, "
        f"step {adaptive.step}, beta1 {adaptive.beta1}, beta2 {adaptive.beta2})"
    )


# autotune always proposes the first draft token; a minimum of 1 keeps every draft
MIN_DRAFT = 1

FLAGS = ("--spec-type", "--spec-draft-n-max", "--spec-draft-n-min", "--spec-draft-p-min")


def render_llamacpp(d: Deployment) -> Rendered:
    spec: SelfSpecSettings = d.settings
    warnings = [
        f"llama.cpp drafts with a separate draft model (-md) and cannot skip the target's own "
        f"sublayers: the skip mask (attention {spec.skip.attention}, mlp {spec.skip.mlp}) is "
        f"not expressible; supply a small draft GGUF with the same tokenizer, and only the "
        f"draft length and confidence exit below carry over (the measured "
        f"{speedup_text(spec)} does not)"
    ]
    adaptive = spec.draft.adaptive
    if adaptive is not None:
        warnings.append(
            f"llama.cpp keeps the draft confidence threshold fixed: "
            f"{_adaptive_threshold(adaptive)} is not expressible"
        )
    warnings += cape_warning("llama.cpp", spec.cape)
    values = ("draft-simple", spec.draft.max_tokens, MIN_DRAFT, spec.draft.exit_threshold)
    notes = ["append these flags to: llama-server -m MODEL.gguf --spec-draft-model DRAFT.gguf"]
    return flags_file(LLAMACPP, d, warnings, notes, list(zip(FLAGS, values)), one_line=True)


def parse_flags(text: str) -> dict[str, str]:
    """The export's flag line back as {flag: value}, for checking."""
    line = next(x for x in text.splitlines() if x.strip() and not x.startswith("#"))
    words = line.split()
    return dict(zip(words[::2], words[1::2]))


def render_dv(d: Deployment) -> Rendered:
    spec: SelfSpecSettings = d.settings
    skip = SkipMask.of(spec.skip.attention, spec.skip.mlp)
    warnings = cape_warning("Draft & Verify", spec.cape)
    adaptive = spec.draft.adaptive
    kwargs: dict[str, object] = {
        "max_step_draft": spec.draft.max_tokens,
        "th_stop_draft": spec.draft.exit_threshold,
        "auto_th_stop_draft": adaptive is not None,
    }
    if adaptive is not None:
        # Draft & Verify's order: [every n verifications, beta1, target acceptance, step, beta2]
        kwargs["auto_parameters"] = [
            1,
            adaptive.beta1,
            adaptive.target_acceptance,
            adaptive.step,
            adaptive.beta2,
        ]
    notes = [
        "pass generate_kwargs to exact_self_speculative_generate",
        "Draft & Verify keeps the draft token whose confidence fell below th_stop_draft "
        "(autotune's drafter leaves it out), so its drafts run one token longer",
    ]
    meta = json_meta(DV, d, warnings, notes)
    meta["generate_kwargs"] = kwargs
    data = {d.model.name: skip.as_dict(), JSON_META_KEY: meta}
    return Rendered(json_text(data), warnings)


def parse_skip_layers(text: str, model: str | None = None) -> SkipMask:
    """A skip mask from a ``skip_layers.json``: ``model``'s entry, or the only one."""
    data = json.loads(text)
    models = [key for key in data if key != JSON_META_KEY]
    if model is None:
        if len(models) != 1:
            raise ValueError(
                f"skip_layers.json has {len(models)} models ({', '.join(models)}); "
                "name the one to read"
            )
        model = models[0]
    if model not in models:
        raise ValueError(f"skip_layers.json has no entry for {model}; it has {', '.join(models)}")
    entry = data[model]
    return SkipMask.of(entry["attention"], entry["mlp"])


HF = engine_exporter("hf", "GenerationConfig assistant_early_exit", render_hf)
LLAMACPP = engine_exporter("llamacpp", "llama-server --spec-type draft-simple", render_llamacpp)
DV = Exporter(
    engine="dv",
    engine_version="Draft & Verify (dilab-zju/self-speculative-decoding) skip_layers.json "
    "and exact_self_speculative_generate",
    filename="skip_layers.json",
    render=render_dv,
)

EXPORTERS = {e.engine: e for e in (HF, LLAMACPP, DV)}
CANNOT = dict.fromkeys(
    ("vllm", "sglang", "trtllm"),
    "it drafts with a separate model or heads and cannot skip the target's "
    "own sublayers (layer-skip self-speculation)",
)
