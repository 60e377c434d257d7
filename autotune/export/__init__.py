"""Exports of a profile to serving engines' own configuration formats.

``EXPORTERS`` maps an engine name to its ``Exporter``; ``export_profile`` picks the
method, renders it and returns an ``Export`` whose ``warnings`` list what the engine
cannot express (also written into the exported text). One module per engine:

- ``vllm``: ``speculative_config`` (YAML), EAGLE and Medusa
- ``sglang``: server flags, EAGLE
- ``trtllm``: LLM-API ``speculative_config`` (YAML) and engine-flow tree strings,
  Medusa and EAGLE
- ``hf``: a transformers ``generation_config.json`` fragment, self-speculative (early exit)
- ``llamacpp``: llama-server flags of both dialects, self-speculative (draft length, exit)
- ``dv``: Draft & Verify's ``skip_layers.json``, self-speculative
"""
from __future__ import annotations

from autotune.errors import AutotuneError
from autotune.export import dv, hf, llamacpp, sglang, trtllm, vllm
from autotune.export.base import Export, Exporter, choose_method
from autotune.profile.schema import Profile

EXPORTERS: dict[str, Exporter] = {module.EXPORTER.engine: module.EXPORTER
                                  for module in (vllm, sglang, trtllm, hf, llamacpp, dv)}


def get_exporter(engine: str) -> Exporter:
    exporter = EXPORTERS.get(engine.strip().lower())
    if exporter is None:
        raise AutotuneError(f"unknown engine '{engine}'; choose one of: {', '.join(EXPORTERS)}")
    return exporter


def export_profile(profile: Profile, engine: str, method: str | None = None) -> Export:
    """Render ``method`` (default: the profile's recommended one) for ``engine``."""
    exporter = get_exporter(engine)
    name, choice_warnings = choose_method(profile, exporter, method)
    if name == "self_spec":
        _check_mask_fits(profile)
    rendered = exporter.render(profile, name)
    # a switch of method is said on stderr; the file itself says which method it holds
    warnings = tuple(choice_warnings + rendered.warnings)
    return Export(engine=exporter.engine, method=name, engine_version=exporter.engine_version,
                  text=rendered.text, filename=exporter.filename, warnings=warnings)


def _check_mask_fits(profile: Profile) -> None:
    skip, num_layers = profile.methods.self_spec.skip, profile.model.num_layers
    outside = sorted({i for i in (*skip.attention, *skip.mlp) if not 0 <= i < num_layers})
    if outside:
        raise AutotuneError(f"the profile's skip mask names layers {outside}, outside the "
                            f"model's {num_layers} layers (0..{num_layers - 1})")


__all__ = ["EXPORTERS", "Export", "Exporter", "export_profile", "get_exporter"]
