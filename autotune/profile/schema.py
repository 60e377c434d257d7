"""The decoding profile, schema ``autotune/profile@1`` (see DESIGN.md).

The ``methods`` block holds one optional block per registered method, each validated by
that method's own settings model: the schema is built from the registry
(``profile_model``), so a method added there is known here without another edit.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, create_model

from autotune.methods import registry
from autotune.profile.blocks import (
    Block,
    Environment,
    HardwareInfo,
    MethodSettings,
    ModelInfo,
    Verdict,
    Workload,
)

SCHEMA: Literal["autotune/profile@1"] = "autotune/profile@1"


class ProfileBase(Block):
    schema_: Literal["autotune/profile@1"] = Field(SCHEMA, alias="schema")
    model: ModelInfo
    hardware: HardwareInfo
    environment: Environment | None = None
    workload: Workload
    recommended: str
    verdict: Verdict | None = None
    methods: BaseModel

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    # what the profile names that is not on this machine, as read (``profile.travel``):
    # ``methods.<m>.<field>`` -> one line saying what is missing and how to point at it
    _missing: dict[str, str] = PrivateAttr(default_factory=dict)

    def __eq__(self, other: object) -> bool:
        """The same content (what this machine lacks of it is no part of a profile)."""
        if not isinstance(other, ProfileBase):
            return NotImplemented
        return type(self) is type(other) and self.__dict__ == other.__dict__

    def missing(self, method: str | None = None) -> list[str]:
        """``field: what is missing and how to point at it``, one line each: all of the
        profile's, or ``method``'s."""
        prefix = f"methods.{method}." if method is not None else ""
        return [f"{w}: {line}" for w, line in self._missing.items() if w.startswith(prefix)]

    def method_blocks(self) -> dict[str, MethodSettings]:
        """The methods this profile holds, by name."""
        return {name: block for name, block in self.methods if block is not None}

    def block(self, method: str) -> Any:
        """The settings block of ``method`` (a registered name), or None when the profile
        has none. Typed ``Any``: each method's block is its own settings model."""
        return getattr(self.methods, method, None)


_BUILT: dict[int, type[ProfileBase]] = {}


def profile_model() -> type[ProfileBase]:
    """The profile schema for the methods registered now."""
    version = registry.version()
    if version not in _BUILT:
        fields: dict[str, Any] = {
            name: (entry.settings_model | None, None) for name, entry in registry.methods().items()
        }
        methods = create_model("Methods", __base__=Block, **fields)
        _BUILT.clear()
        _BUILT[version] = create_model(
            "Profile", __base__=ProfileBase, methods=(methods, Field(default_factory=methods))
        )
    return _BUILT[version]


def methods_block(**blocks) -> BaseModel:
    """The ``methods`` block holding ``blocks`` (name -> settings)."""
    model: Any = profile_model().model_fields["methods"].annotation
    return model(**blocks)


def recommend(methods: BaseModel) -> str:
    """The fastest method measured faster than plain greedy, else 'none'."""
    best, best_speedup = "none", 1.0
    for name, method in methods:
        if (
            method is not None
            and method.measured is not None
            and method.measured.speedup > best_speedup
        ):
            best, best_speedup = name, method.measured.speedup
    return best
