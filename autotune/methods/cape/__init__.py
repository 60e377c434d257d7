"""CAPE: confidence-aware proposal expansion (from GLIDE) on any chain method."""

from __future__ import annotations

from typing import Any, ClassVar

from autotune.methods.base import Expansion, Method, TuneContext
from autotune.methods.cape.space import CapeSpace


class Cape(Expansion):
    name = "cape"
    title = "CAPE: confidence-aware proposal expansion"
    summary = (
        "widens a chain method's drafts where the draft is unsure: the bin of each "
        "step's top-1 probability says how many runner-up tokens join it"
    )
    space_model: ClassVar = CapeSpace
    settings_field: ClassVar = "cape"
    label: ClassVar = "CAPE"
    # each chain method's fit gets half of what is left of the phase when it starts
    fit_share: ClassVar = 0.5

    def fitted(self, method: Method, settings: Any, ctx: TuneContext) -> Any:
        from autotune.methods.cape.fit import fit

        return settings.model_copy(update={"cape": fit(method, settings, ctx)})

    def describe(self, block: Any) -> str:
        return block.policy().describe()


ENTRY = Cape()
