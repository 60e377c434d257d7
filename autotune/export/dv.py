"""Draft & Verify (dilab-zju/self-speculative-decoding): its ``skip_layers.json``,
``{"<model>": {"attention": [...], "mlp": [...]}}``, read as
``skip_layers[model]["attention"]`` and ``["mlp"]`` to set the draft's skipped layers.

The draft-exit settings have no place in that file; they are arguments of its
``exact_self_speculative_generate`` (``max_step_draft``, ``th_stop_draft``,
``auto_th_stop_draft``, ``auto_parameters``), given under ``"_autotune"`` with the
warnings, a key its loader never reads.
"""
from __future__ import annotations

import json

from autotune.engine.skip import SkipMask
from autotune.export.base import (JSON_META_KEY, Exporter, Rendered, cape_warning, json_meta,
                                  json_text)
from autotune.profile.schema import Profile, SelfSpecMethod

TITLE = "Draft & Verify"


def render(profile: Profile, method: str) -> Rendered:
    spec: SelfSpecMethod = profile.methods.self_spec
    skip = SkipMask.of(spec.skip.attention, spec.skip.mlp)
    warnings = cape_warning(TITLE, spec.cape)
    adaptive = spec.draft.adaptive
    kwargs = {"max_step_draft": spec.draft.max_tokens,
              "th_stop_draft": spec.draft.exit_threshold,
              "auto_th_stop_draft": adaptive is not None}
    if adaptive is not None:
        # Draft & Verify's order: [every n verifications, beta1, target acceptance, step, beta2]
        kwargs["auto_parameters"] = [1, adaptive.beta1, adaptive.target_acceptance,
                                     adaptive.step, adaptive.beta2]
    notes = ["pass generate_kwargs to exact_self_speculative_generate",
             "Draft & Verify keeps the draft token whose confidence fell below th_stop_draft "
             "(autotune's drafter leaves it out), so its drafts run one token longer"]
    meta = json_meta(EXPORTER, profile, method, warnings, notes)
    meta["generate_kwargs"] = kwargs
    data = {profile.model.name: skip.as_dict(), JSON_META_KEY: meta}
    return Rendered(json_text(data), warnings)


def parse_skip_layers(text: str, model: str | None = None) -> SkipMask:
    """A skip mask from a ``skip_layers.json``: ``model``'s entry, or the only one."""
    data = json.loads(text)
    models = [key for key in data if key != JSON_META_KEY]
    if model is None:
        if len(models) != 1:
            raise ValueError(f"skip_layers.json has {len(models)} models ({', '.join(models)}); "
                             "name the one to read")
        model = models[0]
    if model not in models:
        raise ValueError(f"skip_layers.json has no entry for {model}; it has {', '.join(models)}")
    entry = data[model]
    return SkipMask.of(entry["attention"], entry["mlp"])


EXPORTER = Exporter(
    engine="dv", title=TITLE,
    engine_version="Draft & Verify (dilab-zju/self-speculative-decoding) skip_layers.json "
                   "and exact_self_speculative_generate",
    filename="skip_layers.json",
    methods=("self_spec",),
    cannot={"medusa": "it drafts only with the target's own layers skipped",
            "eagle": "it drafts only with the target's own layers skipped"},
    render=render)
