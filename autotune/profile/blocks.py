"""The parts of a profile every method shares: what was measured, on which model,
hardware and workload, and the base of each method's block."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_serializer


class Block(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelInfo(Block):
    name: str
    path: str
    fingerprint: str
    architecture: str
    num_layers: int
    hidden_size: int
    vocab_size: int
    dtype: str


class HardwareInfo(Block):
    device: str
    device_name: str
    threads: int
    torch_version: str


class Workload(Block):
    prompts: str
    num_prompts: int
    max_new_tokens: int
    temperature: float = 0.0


class Measured(Block):
    """Wall-clock figures against plain greedy decoding, same process, interleaved."""

    speedup: float
    tokens_per_step: float
    acceptance_rate: float
    tokens_per_s: float
    baseline_tokens_per_s: float
    lossless: bool | None
    prompts: int


class MethodSettings(Block):
    """The base of every method's block: its own settings come first, then these."""

    measured: Measured | None = None  # held-back prompts: the figure reported
    study: str | dict[str, str] | None = None  # the study (or studies) it came from
    search: dict = Field(default_factory=dict)  # how it was found, for the curious

    @model_serializer(mode="wrap")
    def _own_settings_first(self, handler):
        data = handler(self)
        return {key: data[key] for key in field_names(type(self)) if key in data}


def field_names(model: type[BaseModel]) -> list[str]:
    """A block's keys as the YAML shows them: a method's own settings before the fields
    every method shares."""
    names = [info.alias or name for name, info in model.model_fields.items()]
    if issubclass(model, MethodSettings):
        shared = set(MethodSettings.model_fields)
        names = [n for n in names if n not in shared] + [n for n in names if n in shared]
    return names


def canonical_tree(choices) -> list[list[int]]:
    """A token tree in ``choices`` form, checked and in canonical order."""
    from autotune.engine.tree import check_tree

    return [list(p) for p in check_tree(choices)]
