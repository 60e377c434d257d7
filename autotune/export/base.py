"""What every exporter shares: the result, the exporter record, and the provenance and
warnings each export carries. Exporters live in their method's package
(``autotune.methods.<name>.export``), one per engine that can serve the method.

An exporter turns one method of a profile into one engine's native configuration. What
the engine cannot express is never dropped silently: it becomes a warning, returned to
the caller (the CLI prints it on stderr) and written into the file itself, as ``#``
comments in YAML and flag files, and under the ``"_autotune"`` key in JSON files (a key
the engines ignore: transformers' ``GenerationConfig`` and Draft & Verify's loader only
read the keys they know).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.profile.blocks import (
    AUTOTUNE_ENGINE,
    EngineFigures,
    HardwareInfo,
    MethodSettings,
    ModelInfo,
    by_rule,
)

JSON_META_KEY = "_autotune"


@dataclass(frozen=True)
class Deployment:
    """What an exporter is given: one method's block of a profile and the facts about the
    model and the hardware it was measured for (not the whole profile)."""

    method: str  # the method's registered name
    settings: Any  # its settings block (each method's own model, a ``MethodSettings``)
    model: ModelInfo
    hardware: HardwareInfo
    # the engine whose own drafting rule the settings follow (its own setting, measured in
    # autotune's engine by that rule), and that setting measured in the engine itself
    rule: str | None = None
    in_engine: EngineFigures | None = None

    @classmethod
    def of(cls, profile: Any, method: str, engine: str | None = None) -> Deployment:
        """``method``'s deployment from a profile (``ProfileBase``); for ``engine``: with
        that engine's own setting's provenance, where the block holds one."""
        settings: MethodSettings | None = profile.block(method)
        if settings is None:
            raise ValueError(f"the profile has no {method} settings")
        variant = settings.engines.get(engine) if engine is not None else None
        if variant is None:
            return cls(method, settings, profile.model, profile.hardware)
        return cls(method, settings, profile.model, profile.hardware, engine, variant.in_engine)


@dataclass(frozen=True)
class Export:
    """One engine's configuration for one method of a profile."""

    engine: str
    method: str
    engine_version: str  # the engine release(s) whose field names this follows
    text: str  # the file's content, warnings included as comments
    filename: str  # a suggested file name
    warnings: tuple[str, ...] = ()
    # provenance, warnings and notes of a file that cannot hold them (a JSON file the
    # engine reads key by key): written beside it (``about_path``)
    about: str | None = None
    companion: Companion | None = None

    def companion_path(self, out: Path | None) -> Path | None:
        """Where the companion goes: beside ``out``, or its own name when printed."""
        if self.companion is None:
            return None
        if out is None:
            return Path(self.companion.name)
        return out.with_name(out.stem + self.companion.suffix)

    def text_for(self, out: Path | None) -> str:
        """The text to write to ``out``, naming the companion where it is written."""
        path = self.companion_path(out)
        if self.companion is None or path is None:
            return self.text
        return self.text.replace(self.companion.name, str(path))


@dataclass(frozen=True)
class Companion:
    """A second file an export's text points to (SGLang's adaptive schedule): written
    beside the export as ``<its stem><suffix>``; the text names it ``name`` until then."""

    name: str
    suffix: str
    text: str


def about_path(out: Path) -> Path:
    """Where the ``about`` text of an export written to ``out`` goes."""
    return out.with_name(f"{out.stem}.autotune.txt")


@dataclass
class Rendered:
    """What an engine module returns: the file's text and what it could not express."""

    text: str
    warnings: list[str] = field(default_factory=list)
    about: str | None = None  # see ``Export.about``
    companion: Companion | None = None  # see ``Export.companion``


@dataclass(frozen=True)
class Exporter:
    """One engine's exporter for one method."""

    engine: str  # the engine's name on the command line: "trtllm"
    engine_version: str  # the release(s) whose field names this follows
    filename: str  # a suggested file name
    render: Callable[[Deployment], Rendered]

    @property
    def title(self) -> str:
        from autotune.export.engines import ENGINES

        return ENGINES[self.engine]


LOSSLESS = {True: "lossless", False: "NOT lossless", None: "lossless not checked"}


def provenance(d: Deployment) -> list[str]:
    """Where the settings come from and where each figure was measured, in a few lines
    for the top of the file."""
    measured = d.settings.measured
    where = "held-back"
    if measured is None:  # an engine's own setting the held-back measurement had no time for
        measured, where = d.settings.selection, "search"
    model = d.model
    lines = [
        f"model: {model.name} ({model.architecture}, {model.num_layers} layers, "
        f"fingerprint {model.fingerprint})"
    ]
    if measured is None:
        return [*lines, f"method: {d.method}; not measured by autotune (the proxy's choice)"]
    tuned_in = d.settings.search.get("tuned_in") if isinstance(d.settings.search, dict) else None
    measured_in = tuned_in or (by_rule(d.rule) if d.rule else AUTOTUNE_ENGINE)
    lines.append(
        f"method: {d.method}; measured in {measured_in} on {d.hardware.device} "
        f"({d.hardware.device_name}): {measured.speedup:.3f}x plain greedy, "
        f"{measured.tokens_per_step:.2f} tokens/step, {LOSSLESS[measured.lossless]}, "
        f"{measured.prompts} {where} prompts"
    )
    return lines + in_engine_provenance(d.in_engine)


def in_engine_provenance(figures: EngineFigures | None) -> list[str]:
    """The setting measured in the serving engine itself, where it was."""
    if figures is None:
        return []
    low, high = figures.speedup_interval or [figures.speedup, figures.speedup]
    lossless = LOSSLESS[figures.lossless]
    if figures.first_difference:
        lossless += f" (first difference at {figures.first_difference})"
    return [
        f"measured in {figures.measured_in} ({figures.release}): {figures.speedup:.3f}x "
        f"[{low:.3f}, {high:.3f}] of its own greedy decoding, {lossless}, "
        f"{figures.prompts} held-back prompts"
    ]


def speedup_text(block) -> str:
    """A method block's held-back speedup for a sentence: "1.234x", or "unmeasured"."""
    return "unmeasured" if block.measured is None else f"{block.measured.speedup:.3f}x"


def comment_lines(
    exporter: Exporter,
    d: Deployment,
    warnings: list[str],
    notes: Sequence[str] = (),
) -> list[str]:
    """The ``#`` header of a YAML or flag file: target, provenance, warnings, notes."""
    lines = [
        f"autotune export for {exporter.title}; targets {exporter.engine_version}",
        *provenance(d),
    ]
    lines += [f"warning: {w}" for w in warnings]
    lines += [f"note: {n}" for n in notes]
    return [f"# {line}" for line in lines]


def about_text(
    exporter: Exporter, d: Deployment, warnings: list[str], notes: Sequence[str] = ()
) -> str:
    """The text written beside a JSON file that the engine reads key by key (an extra key
    makes transformers' ``generate()`` refuse the settings): ``comment_lines`` as prose."""
    lines = comment_lines(exporter, d, warnings, notes)
    return "\n".join(line.removeprefix("# ") for line in lines) + "\n"


def json_meta(
    exporter: Exporter,
    d: Deployment,
    warnings: list[str],
    notes: Sequence[str] = (),
) -> dict:
    """The ``"_autotune"`` entry of a JSON export: the same as ``comment_lines``."""
    return {
        "exported_for": exporter.title,
        "engine_version": exporter.engine_version,
        "provenance": provenance(d),
        "warnings": list(warnings),
        "notes": list(notes),
    }


def cape_warning(title: str, cape) -> list[str]:
    """CAPE widens a chain draft where the drafter is unsure; no engine has it."""
    if cape is None:
        return []
    measured = f", measured {cape.measured.speedup:.3f}x" if cape.measured else ""
    return [
        f"{title} has no confidence-aware expansion (CAPE: bins {cape.bins} -> "
        f"{cape.expansion} tokens per step, verify budget {cape.max_verify_tokens}"
        f"{measured}); the export drafts without it"
    ]


def speculative_config(
    exporter: Exporter,
    d: Deployment,
    config: dict,
    warnings: list[str],
    notes: list[str],
    command_line: bool = False,
) -> Rendered:
    """A ``speculative_config:`` YAML file (vLLM, TensorRT-LLM) under its ``#`` header;
    ``command_line``: the same dict as one-line JSON in a comment, for a flag."""
    lines = comment_lines(exporter, d, warnings, notes)
    if command_line:
        lines.append(f"# command line: --speculative-config '{json.dumps(config)}'")
    lines += yaml_lines({"speculative_config": config})
    return Rendered("\n".join(lines) + "\n", warnings)


def yaml_lines(mapping: dict, indent: int = 0) -> list[str]:
    """A small, stable YAML writer for flat settings: strings double-quoted (JSON escapes
    are valid YAML), numbers and booleans bare, nested mappings indented, and values
    given as ``Flow`` written as they are (trees in flow style, ``[[0], [0, 0]]``)."""
    pad = " " * indent
    lines = []
    for key, value in mapping.items():
        if isinstance(value, dict):
            lines.append(f"{pad}{key}:")
            lines += yaml_lines(value, indent + 2)
        else:
            lines.append(f"{pad}{key}: {yaml_scalar(value)}")
    return lines


class Flow(str):
    """Text already in YAML flow syntax (e.g. a tree): written without quotes."""


def yaml_scalar(value) -> str:
    if isinstance(value, Flow):
        return str(value)
    if isinstance(value, list):  # of numbers and lists: JSON is YAML's flow syntax
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value))


_SCALAR = r"(?:-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|true|false|null)"
_SCALAR_LIST = re.compile(rf"\[\s*({_SCALAR}(?:\s*,\s*{_SCALAR})*)\s*\]")


def json_text(data: dict) -> str:
    """Indented JSON with lists of numbers kept on one line (``"mlp": [6, 9, 10]``), as
    hand-written configuration files have them."""
    text = json.dumps(data, indent=2)
    return (
        _SCALAR_LIST.sub(lambda m: "[" + ", ".join(re.split(r"\s*,\s*", m[1])) + "]", text) + "\n"
    )
