"""The self-speculative search space, read from ``search_spaces/self_spec.yaml``."""
from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from autotune.errors import AutotuneError

SEARCH_SPACES = Path(__file__).resolve().parents[2] / "search_spaces"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SkipMaskSpace(_Strict):
    keep_first: int = 1
    keep_last: int = 1
    min_skip_ratio: float = 0.1
    max_skip_ratio: float = 0.7
    trials: int = 60
    sampler: str = "gp"
    confirm_top: int = 3
    max_tokens_choices: list[int] = [1, 2, 3, 4, 6, 8]
    exit_threshold_choices: list[float] = [0.0, 0.5, 0.8]

    @model_validator(mode="after")
    def _check(self):
        if not 0 <= self.min_skip_ratio < self.max_skip_ratio <= 1:
            raise ValueError("need 0 <= min_skip_ratio < max_skip_ratio <= 1")
        if self.sampler not in ("gp", "skopt"):
            raise ValueError("sampler must be 'gp' or 'skopt'")
        return self

    def skippable_layers(self, num_layers: int) -> list[int]:
        return list(range(self.keep_first, num_layers - self.keep_last))


class DraftExitSpace(_Strict):
    trials: int = 10
    max_tokens: tuple[int, int] = (1, 8)
    exit_threshold: tuple[float, float] = (0.0, 0.95)
    adaptive: list[bool] = [False, True]
    target_acceptance: tuple[float, float] = (0.5, 0.95)
    step: tuple[float, float] = (0.001, 0.05)
    beta1: tuple[float, float] = (0.3, 0.9)
    beta2: tuple[float, float] = (0.5, 0.95)


class Calibration(_Strict):
    prompts: int = 8
    tokens: int = 64


class MeasureSettings(_Strict):
    search_prompts: int = 4
    search_tokens: int = 48
    confirm_prompts: int = 16
    confirm_tokens: int = 128


class SelfSpecSpace(_Strict):
    skip_mask: SkipMaskSpace = SkipMaskSpace()
    draft_exit: DraftExitSpace = DraftExitSpace()
    calibration: Calibration = Calibration()
    measure: MeasureSettings = MeasureSettings()


def load_self_spec_space(path: str | Path | None = None) -> SelfSpecSpace:
    path = Path(path) if path else SEARCH_SPACES / "self_spec.yaml"
    if not path.is_file():
        raise AutotuneError(f"search space {path} not found: pass --search-space FILE")
    try:
        return SelfSpecSpace.model_validate(yaml.safe_load(path.read_text()) or {})
    except (yaml.YAMLError, ValidationError) as exc:
        first = str(exc).replace("\n", " ")[:300]
        raise AutotuneError(f"search space {path} is invalid: {first}") from None
