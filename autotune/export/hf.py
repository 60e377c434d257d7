"""transformers: a ``generation_config.json`` fragment for self-speculative decoding by
early exit (``assistant_early_exit``: the model drafts with its first E layers, then its
final norm and LM head), with ``num_assistant_tokens``, ``num_assistant_tokens_schedule``
and ``assistant_confidence_threshold``.

How transformers 5.23 reads them (checked in ``tests/test_export.py``): for early exit the
draft length and confidence threshold come from the model's own generation config
(``generation_config.json``, ``model.generation_config``); passed as arguments of
``generate()`` they are ignored (it then drafts 20 tokens with a 0.4 threshold, its
defaults). With ``assistant_early_exit`` in the model's generation config too, the draft's
own inner ``generate()`` inherits it and drafts by early exit again, nested a few levels
deep: still exact, but slower. So the fragment holds all four keys, and its notes say to
pass ``assistant_early_exit`` to ``generate()`` instead where that nesting matters.
"""
from __future__ import annotations

import json

from autotune.engine.skip import SkipMask
from autotune.export.base import (JSON_META_KEY, Exporter, Rendered, cape_warning, json_meta,
                                  json_text)
from autotune.profile.schema import Profile, SelfSpecMethod

TITLE = "transformers"


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


def render(profile: Profile, method: str) -> Rendered:
    spec: SelfSpecMethod = profile.methods.self_spec
    num_layers = profile.model.num_layers
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
            f"{spec.measured.speedup:.3f}x (the output stays exact), and models not trained "
            f"for early exit draft poorly from an intermediate layer")
    adaptive = spec.draft.adaptive
    if adaptive is not None:
        warnings.append(
            f"transformers keeps assistant_confidence_threshold fixed when drafting by early "
            f"exit: Draft & Verify's adaptive threshold (target acceptance "
            f"{adaptive.target_acceptance}, step {adaptive.step}, beta1 {adaptive.beta1}, "
            f"beta2 {adaptive.beta2}) is not expressible; the threshold stays at its initial "
            f"{spec.draft.exit_threshold}")
    warnings += cape_warning(TITLE, spec.cape)
    notes = ["merge these keys into the model folder's generation_config.json (or set them "
             "on model.generation_config): for early exit transformers reads the draft length "
             "and threshold from the model's own generation config, not from arguments of "
             "generate()",
             f"transformers 5.23: with assistant_early_exit in the model's generation config "
             f"the draft's own generate() inherits it and nests early-exit drafting (exact, "
             f"slower); to avoid that, leave it out of generation_config.json and pass "
             f"assistant_early_exit={exit_layer} to generate()",
             "num_assistant_tokens_schedule is constant: the draft length is a fixed cap; "
             "the confidence threshold ends each draft early",
             "transformers keeps the draft token whose confidence fell below the threshold "
             "(autotune's drafter leaves it out), so its drafts run one token longer"]
    fragment = {
        "assistant_early_exit": exit_layer,
        "num_assistant_tokens": spec.draft.max_tokens,
        "num_assistant_tokens_schedule": "constant",
        "assistant_confidence_threshold": spec.draft.exit_threshold,
        JSON_META_KEY: json_meta(EXPORTER, profile, method, warnings, notes),
    }
    return Rendered(json_text(fragment), warnings)


def generation_settings(text: str) -> dict:
    """The fragment's generation keys, without autotune's own entry."""
    return {k: v for k, v in json.loads(text).items() if k != JSON_META_KEY}


EXPORTER = Exporter(
    engine="hf", title=TITLE,
    engine_version="transformers >= 4.47 GenerationConfig (assistant_early_exit); checked "
                   "with transformers 5.23",
    filename="generation_config.json",
    methods=("self_spec",),
    cannot={"medusa": "its generate() has no Medusa heads",
            "eagle": "its generate() has no EAGLE draft head"},
    render=render)
