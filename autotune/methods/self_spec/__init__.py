"""Draft & Verify self-speculation: the target drafts for itself with some attention and
MLP sublayers skipped. Tuned: the skip mask (Bayesian optimisation on a proxy) and the
adaptive draft exit (on measured speed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from autotune.methods.base import DraftEnv, Method, TuneContext
from autotune.methods.self_spec.export import CANNOT, EXPORTERS
from autotune.methods.self_spec.settings import SelfSpecSettings
from autotune.methods.self_spec.space import SelfSpecSpace


class SelfSpec(Method):
    name = "self_spec"
    title = "Draft & Verify self-speculation"
    summary = "the target drafts for itself with some attention and MLP sublayers skipped"
    settings_model: ClassVar = SelfSpecSettings
    space_model: ClassVar = SelfSpecSpace
    chain = True
    # the skip-mask search on the proxy, then the draft-exit study on measured speed
    time_shares: ClassVar = {"mask search": 0.6, "draft-exit study": 0.9}
    probes = True
    exporters: ClassVar = EXPORTERS
    cannot_export: ClassVar = CANNOT

    def drafter(self, settings: SelfSpecSettings, env: DraftEnv):
        from autotune.drafters.self_spec import LayerSkipDrafter

        skip, policy = settings.skip_mask(), settings.exit_policy()
        return lambda: LayerSkipDrafter(skip, policy)

    def chain_drafter(
        self, settings: SelfSpecSettings, env: DraftEnv, ranked_width: int, depth: int | None = None
    ):
        from autotune.drafters.self_spec import LayerSkipDrafter

        skip, policy = settings.skip_mask(), settings.exit_policy()
        return lambda: LayerSkipDrafter(skip, policy, ranked_width)

    def chain_models(self, settings: SelfSpecSettings, ctx: TuneContext) -> list[Any]:
        from autotune.methods.self_spec.chain import chain_models

        return chain_models(settings, ctx)

    def examples(self, model: Any, folder: Path) -> dict[str, SelfSpecSettings]:
        from autotune.drafters.self_spec import AdaptiveExit, DraftExitPolicy
        from autotune.engine.skip import SkipMask

        last = model.config.num_hidden_layers - 1
        return {
            "adaptive": SelfSpecSettings.of(
                SkipMask.of(attention=[1], mlp=[last - 1]), DraftExitPolicy(4, 0.3, AdaptiveExit())
            ),
            "static": SelfSpecSettings.of(SkipMask.of(mlp=[last]), DraftExitPolicy(6, 0.0, None)),
        }

    def problems(self, settings: SelfSpecSettings, model: Any) -> list[str]:
        layers = model.num_layers
        out = []
        for kind in ("attention", "mlp"):
            outside = sorted(i for i in getattr(settings.skip, kind) if not 0 <= i < layers)
            if outside:
                out.append(
                    f"skip.{kind}: layers {outside} are outside the model's {layers} "
                    f"layers (0..{layers - 1})"
                )
        if not settings.skip.attention and not settings.skip.mlp:
            out.append("skip: skips no sublayer, so the draft is the target itself")
        return out


ENTRY = SelfSpec()
