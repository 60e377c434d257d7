"""CAPE: confidence-aware proposal expansion (from GLIDE) on any chain method."""

from __future__ import annotations

from typing import ClassVar

from autotune.methods.base import Expansion
from autotune.methods.cape.space import CapeSpace


class Cape(Expansion):
    name = "cape"
    title = "CAPE: confidence-aware proposal expansion"
    summary = (
        "widens a chain method's drafts where the draft is unsure: the bin of each "
        "step's top-1 probability says how many runner-up tokens join it"
    )
    space_model: ClassVar = CapeSpace


ENTRY = Cape()
