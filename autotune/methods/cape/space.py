"""CAPE's fit settings (defaults: ``space.yaml`` beside this)."""

from __future__ import annotations

from pydantic import model_validator

from autotune.methods.spaces import Calibration, Strict, Trials
from autotune.tuners.cape_fit import FitSettings


class CapeSpace(Strict):
    calibration: Calibration
    fine_bins: int  # confidence resolution: bin edges fall on multiples of 1/fine_bins
    max_expansion: int  # tokens proposed at one step, the chain's included
    max_verify_tokens: int  # verified tree size, root included
    max_chain_depth: int  # tree methods' chains: the depths tried
    min_gain: float  # a fit step must raise the predicted speedup this much (relative)
    selection: Trials  # with and without the fit, decoded on search prompts

    @model_validator(mode="after")
    def _check(self):
        if not 2 <= self.fine_bins <= 100 or not 1 <= self.max_expansion <= 10:
            raise ValueError(
                "need 2 <= fine_bins <= 100 and 1 <= max_expansion <= 10 (ranks are counted to 10)"
            )
        if self.max_verify_tokens < 2 or self.max_chain_depth < 1:
            raise ValueError("need max_verify_tokens >= 2 and max_chain_depth >= 1")
        return self

    def fit_settings(self) -> FitSettings:
        return FitSettings(
            self.fine_bins, self.max_expansion, self.max_verify_tokens, self.min_gain
        )
