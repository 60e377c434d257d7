"""The decoding profile, schema ``autotune/profile@1`` (see DESIGN.md)."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

SCHEMA = "autotune/profile@1"


class _Block(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _canonical_tree(choices) -> list[list[int]]:
    """A token tree in ``choices`` form, checked and in canonical order."""
    from autotune.engine.tree import check_tree
    return [list(p) for p in check_tree(choices)]


class ModelInfo(_Block):
    name: str
    path: str
    fingerprint: str
    architecture: str
    num_layers: int
    hidden_size: int
    vocab_size: int
    dtype: str


class HardwareInfo(_Block):
    device: str
    device_name: str
    threads: int
    torch_version: str


class Workload(_Block):
    prompts: str
    num_prompts: int
    max_new_tokens: int
    temperature: float = 0.0


class Measured(_Block):
    """Wall-clock figures against plain greedy decoding, same process, interleaved."""

    speedup: float
    tokens_per_step: float
    acceptance_rate: float
    tokens_per_s: float
    baseline_tokens_per_s: float
    lossless: bool | None
    prompts: int


class CapeSettings(_Block):
    """Confidence-aware proposal expansion on a chain drafter. A drafting step whose top-1
    probability p lies in (bins[i - 1], bins[i]] proposes expansion[i] tokens: the chain's
    own and expansion[i] - 1 runner-ups beside it, never extended."""

    bins: list[float]               # upper edges of the confidence bins, ascending to 1.0
    expansion: list[int]            # tokens proposed per step, one per bin
    max_verify_tokens: int = Field(32, ge=2)   # the verified tree's size, its root included
    chain_depth: int | None = Field(None, ge=1)  # EAGLE: the depth of the chain expanded
    measured: Measured | None = None  # held-back, the drafter with this expansion
    predicted_speedup: float | None = None  # the fit's replay on calibration decoding
    search: dict = Field(default_factory=dict)

    @model_validator(mode="after")
    def _a_valid_policy(self):
        from autotune.drafters.cape import CapePolicy
        CapePolicy(tuple(self.bins), tuple(self.expansion), self.max_verify_tokens)
        return self


class SkipLayers(_Block):
    attention: list[int]
    mlp: list[int]


class Adaptive(_Block):
    target_acceptance: float
    step: float
    beta1: float
    beta2: float


class DraftSettings(_Block):
    max_tokens: int = Field(ge=1)
    exit_threshold: float = Field(ge=0.0, le=1.0)
    adaptive: Adaptive | None = None


class SelfSpecMethod(_Block):
    skip: SkipLayers
    draft: DraftSettings
    cape: CapeSettings | None = None
    measured: Measured
    study: str
    search: dict = Field(default_factory=dict)   # how the setting was found, for the curious


class TypicalSettings(_Block):
    """Medusa's typical acceptance for sampling: accept when p > min(eps, delta*exp(-H))."""

    eps: float = Field(gt=0.0, le=1.0)
    delta: float = Field(gt=0.0)
    temperature: float = Field(gt=0.0)
    min_fidelity: float = Field(ge=0.0, le=1.0)
    sweep: list[dict] = Field(default_factory=list)


class MedusaAcceptance(_Block):
    greedy: Literal["exact"] = "exact"
    typical: TypicalSettings | None = None


class MedusaMethod(_Block):
    heads: str                      # the head folder (upstream Medusa layout)
    num_heads: int = Field(ge=1)    # heads evaluated: the tree's depth
    tree: list[list[int]]           # Medusa / TensorRT-LLM choices, canonical order
    acceptance: MedusaAcceptance = MedusaAcceptance()
    measured: Measured
    study: str
    search: dict = Field(default_factory=dict)

    @field_validator("tree")
    @classmethod
    def _tree_is_a_tree(cls, tree):
        return _canonical_tree(tree)

    @model_validator(mode="after")
    def _depth_within_heads(self):
        depth = max(len(p) for p in self.tree)
        if depth > self.num_heads:
            raise ValueError(f"tree depth {depth} exceeds num_heads {self.num_heads}")
        return self


class StaticEagleTree(_Block):
    kind: Literal["static"] = "static"
    choices: list[list[int]]        # paths of ranks, one rank per drafting step

    @field_validator("choices")
    @classmethod
    def _tree_is_a_tree(cls, choices):
        return _canonical_tree(choices)


class DynamicEagleTree(_Block):
    """EAGLE-2's expansion: verified tokens (root included), expansions, children."""

    kind: Literal["dynamic"] = "dynamic"
    total_tokens: int = Field(ge=2)
    depth: int = Field(ge=0)
    top_k: int = Field(ge=1)


class EagleMethod(_Block):
    head: str                       # the head folder (upstream EAGLE-1/2 layout)
    tree: StaticEagleTree | DynamicEagleTree = Field(discriminator="kind")
    # the draft's lm_head covers the head folder's N most frequent tokens (0: all of them)
    draft_vocab: int = Field(0, ge=0)
    cape: CapeSettings | None = None
    measured: Measured
    alternatives: dict = Field(default_factory=dict)  # both kinds' winners, held-back
    study: dict[str, str]           # tree kind -> study name
    search: dict = Field(default_factory=dict)


class Methods(_Block):
    self_spec: SelfSpecMethod | None = None
    medusa: MedusaMethod | None = None
    eagle: EagleMethod | None = None


class Profile(_Block):
    schema_: Literal["autotune/profile@1"] = Field(SCHEMA, alias="schema")
    model: ModelInfo
    hardware: HardwareInfo
    workload: Workload
    recommended: str
    methods: Methods

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


def recommend(methods: Methods) -> str:
    """The fastest method measured faster than plain greedy, else 'none'."""
    best, best_speedup = "none", 1.0
    for name, method in methods:
        if method is not None and method.measured.speedup > best_speedup:
            best, best_speedup = name, method.measured.speedup
    return best
