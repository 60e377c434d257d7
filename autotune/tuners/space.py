"""Search spaces, read from ``search_spaces/<method>.yaml``: what users can read and edit."""
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


class MedusaCalibration(_Strict):
    prompts: int = 40         # search prompts whose greedy continuations measure the heads
    tokens: int = 128
    max_rank: int = 10        # ranks counted per head (top-k table width)


class MedusaTreeSpace(_Strict):
    max_nodes: int = 127      # tree-size cap; the verify curve is measured to max_nodes + 1
    builders: list[str] = ["greedy", "sequoia"]
    candidates: int = 6       # best predicted (heads, size, builder) confirmed by wall clock
    trials: int = 10          # measured trials in the study (candidates first)
    confirm_prompts: int = 6  # search prompts not used for calibration
    confirm_tokens: int = 64

    @model_validator(mode="after")
    def _check(self):
        unknown = set(self.builders) - {"greedy", "sequoia"}
        if unknown or not self.builders:
            raise ValueError(f"builders must be among greedy, sequoia (got {self.builders})")
        if not 1 <= self.max_nodes <= 255:
            raise ValueError("max_nodes must be within 1..255")
        return self


class TypicalSpace(_Strict):
    temperature: float = 0.7  # sampling temperature the sweep decodes at
    pairs: list[tuple[float, float]] = [(0.01, 0.1), (0.03, 0.17), (0.05, 0.22), (0.09, 0.3),
                                        (0.15, 0.39), (0.25, 0.5)]
    min_fidelity: float | None = None   # None: that of Medusa's defaults (0.09, 0.3)
    prompts: int = 4
    tokens: int = 64


class MedusaSpace(_Strict):
    calibration: MedusaCalibration = MedusaCalibration()
    tree: MedusaTreeSpace = MedusaTreeSpace()
    typical: TypicalSpace = TypicalSpace()
    measure: MeasureSettings = MeasureSettings(confirm_prompts=20, confirm_tokens=128)


class EagleCalibration(_Strict):
    prompts: int = 40         # search prompts whose greedy continuations measure the head
    tokens: int = 128
    max_rank: int = 10        # ranks counted per depth (the widest a static tree branches)
    max_depth: int = 6        # drafting steps measured (the deepest a tree can be)
    # draft vocabularies tried: the most frequent N tokens of the head's training answers
    # (0: the whole vocabulary; heads without a ranked token list use only that)
    draft_vocab: list[int] = [0, 4096, 1024]


class EagleStaticSpace(_Strict):
    max_nodes: int = 63       # size cap; the verify curve is measured to max_nodes + 1
    candidates: int = 4       # best predicted (depth, size) trees measured first
    trials: int = 6           # measured trials in the static-tree study


class EagleDynamicSpace(_Strict):
    total_tokens: tuple[int, int] = (2, 64)   # verified tokens per step, root included
    depth: tuple[int, int] = (0, 5)           # expansions after the first level
    top_k: tuple[int, int] = (1, 10)
    trials: int = 10          # measured trials in the dynamic-tree study

    @model_validator(mode="after")
    def _check(self):
        for name in ("total_tokens", "depth", "top_k"):
            low, high = getattr(self, name)
            if low > high:
                raise ValueError(f"{name}: the lower bound {low} exceeds the upper {high}")
        if self.total_tokens[0] < 2 or self.top_k[0] < 1 or self.depth[0] < 0:
            raise ValueError("need total_tokens >= 2, top_k >= 1, depth >= 0")
        return self


class EagleTrials(_Strict):
    confirm_prompts: int = 6  # search prompts, not used for calibration, timed in trials
    confirm_tokens: int = 64


class EagleSpace(_Strict):
    calibration: EagleCalibration = EagleCalibration()
    static: EagleStaticSpace = EagleStaticSpace()
    dynamic: EagleDynamicSpace = EagleDynamicSpace()
    trials: EagleTrials = EagleTrials()
    measure: MeasureSettings = MeasureSettings(confirm_prompts=20, confirm_tokens=128)


class CapeCalibration(_Strict):
    prompts: int = 16         # search prompts whose greedy continuations the fit replays
    tokens: int = 96          # (EAGLE reuses its own search's calibration instead)


class CapeSpace(_Strict):
    calibration: CapeCalibration = CapeCalibration()
    fine_bins: int = 20       # confidence resolution: bin edges fall on multiples of 1/fine_bins
    max_expansion: int = 8    # tokens proposed at one step, the chain's included
    max_verify_tokens: int = 32  # verified tree size, root included
    max_chain_depth: int = 6  # EAGLE: the chain depths tried (the self-spec chain is its own)
    min_gain: float = 0.002   # a fit step must raise the predicted speedup this much (relative)

    @model_validator(mode="after")
    def _check(self):
        if not 2 <= self.fine_bins <= 100 or not 1 <= self.max_expansion <= 10:
            raise ValueError("need 2 <= fine_bins <= 100 and 1 <= max_expansion <= 10 "
                             "(ranks are counted to 10)")
        if self.max_verify_tokens < 2 or self.max_chain_depth < 1:
            raise ValueError("need max_verify_tokens >= 2 and max_chain_depth >= 1")
        return self


def load_space(method: str, model: type[BaseModel], path: str | Path | None = None):
    path = Path(path) if path else SEARCH_SPACES / f"{method}.yaml"
    if not path.is_file():
        raise AutotuneError(f"search space {path} not found: pass --search-space FILE")
    try:
        return model.model_validate(yaml.safe_load(path.read_text()) or {})
    except (yaml.YAMLError, ValidationError) as exc:
        first = str(exc).replace("\n", " ")[:300]
        raise AutotuneError(f"search space {path} is invalid: {first}") from None


def load_self_spec_space(path: str | Path | None = None) -> SelfSpecSpace:
    return load_space("self_spec", SelfSpecSpace, path)


def load_medusa_space(path: str | Path | None = None) -> MedusaSpace:
    return load_space("medusa", MedusaSpace, path)


def load_eagle_space(path: str | Path | None = None) -> EagleSpace:
    return load_space("eagle", EagleSpace, path)


def load_cape_space(path: str | Path | None = None) -> CapeSpace:
    return load_space("cape", CapeSpace, path)
