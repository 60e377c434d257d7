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

from autotune.profile.schema import ProfileBase

JSON_META_KEY = "_autotune"


@dataclass(frozen=True)
class Export:
    """One engine's configuration for one method of a profile."""

    engine: str
    method: str
    engine_version: str  # the engine release(s) whose field names this follows
    text: str  # the file's content, warnings included as comments
    filename: str  # a suggested file name
    warnings: tuple[str, ...] = ()


@dataclass
class Rendered:
    """What an engine module returns: the file's text and what it could not express."""

    text: str
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Exporter:
    """One engine's exporter for one method."""

    engine: str  # the engine's name on the command line: "trtllm"
    engine_version: str  # the release(s) whose field names this follows
    filename: str  # a suggested file name
    render: Callable[[ProfileBase, str], Rendered]  # (profile, method name) -> file

    @property
    def title(self) -> str:
        from autotune.export.engines import ENGINES

        return ENGINES[self.engine]


def provenance(profile: ProfileBase, method: str) -> list[str]:
    """Where the settings come from, in a few lines for the top of the file."""
    block = getattr(profile.methods, method)
    measured = block.measured
    model = profile.model
    lossless = {True: "lossless", False: "NOT lossless", None: "lossless not checked"}
    return [
        f"model: {model.name} ({model.architecture}, {model.num_layers} layers, "
        f"fingerprint {model.fingerprint})",
        f"method: {method}; measured by autotune on {profile.hardware.device} "
        f"({profile.hardware.device_name}): {measured.speedup:.3f}x plain greedy, "
        f"{measured.tokens_per_step:.2f} tokens/step, {lossless[measured.lossless]}, "
        f"{measured.prompts} held-back prompts",
    ]


def speedup_text(block) -> str:
    """A method block's held-back speedup for a sentence: "1.234x", or "unmeasured"."""
    return "unmeasured" if block.measured is None else f"{block.measured.speedup:.3f}x"


def comment_lines(
    exporter: Exporter,
    profile: ProfileBase,
    method: str,
    warnings: list[str],
    notes: Sequence[str] = (),
) -> list[str]:
    """The ``#`` header of a YAML or flag file: target, provenance, warnings, notes."""
    lines = [
        f"autotune export for {exporter.title}; targets {exporter.engine_version}",
        *provenance(profile, method),
    ]
    lines += [f"warning: {w}" for w in warnings]
    lines += [f"note: {n}" for n in notes]
    return [f"# {line}" for line in lines]


def json_meta(
    exporter: Exporter,
    profile: ProfileBase,
    method: str,
    warnings: list[str],
    notes: Sequence[str] = (),
) -> dict:
    """The ``"_autotune"`` entry of a JSON export: the same as ``comment_lines``."""
    return {
        "exported_for": exporter.title,
        "engine_version": exporter.engine_version,
        "provenance": provenance(profile, method),
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
    profile: ProfileBase,
    method: str,
    config: dict,
    warnings: list[str],
    notes: list[str],
    command_line: bool = False,
) -> Rendered:
    """A ``speculative_config:`` YAML file (vLLM, TensorRT-LLM) under its ``#`` header;
    ``command_line``: the same dict as one-line JSON in a comment, for a flag."""
    lines = comment_lines(exporter, profile, method, warnings, notes)
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
