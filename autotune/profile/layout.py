"""A written profile's layout: what deploying needs first and short (the model, the
recommended method with its setting and its schedule under load, the verdict, then what
it was measured on), and the search's diagnostics in a closing ``diagnostics`` section
of the same file: the other methods measured (the alternatives), each setting's search
record, sweeps and notes, the noise check's samples, the verdict's time ledger and the
methods skipped or dropped.

``diagnostics`` mirrors the profile's shape, holding only what was moved there, so
reading merges it back (``merged``): in memory a profile is one tree, as it always was,
and a profile written before this layout (no ``diagnostics``) reads as it is.
"""

from __future__ import annotations

from typing import Any

DIAGNOSTICS = "diagnostics"
DIAGNOSTICS_COMMENT = "# the search's diagnostics: deploying needs none of what follows\n"
# the deployable part, in this order; keys not named here follow it
FIRST = (
    "schema",
    "model",
    "recommended",
    "methods",
    "verdict",
    "hardware",
    "workload",
    "environment",
)
# keys of a method block, at any depth, that record how its setting was found
SEARCH_KEYS = frozenset({"selection", "study", "search", "notes", "alternatives", "sweep"})
# the verdict's own diagnostics: how often it looked, what was left out, where time went
VERDICT_KEYS = frozenset({"held_back_looks", "skipped", "dropped", "time"})
# the noise check's samples (its finding, busy or not and why, stays with the verdict)
NOISE_KEYS = frozenset({"before", "during"})


def split(data: dict) -> dict:
    """``data`` (a profile as a plain mapping) laid out to be written: the deployable
    part in ``FIRST``'s order, then ``diagnostics``."""
    recommended = data.get("recommended")
    methods, found = {}, {}
    for name, block in (data.get("methods") or {}).items():
        if block is None:
            continue  # a method the profile does not hold
        if name != recommended:
            found[name] = block  # an alternative: whole
            continue
        methods[name], moved = _parted(block, SEARCH_KEYS)
        if moved:
            found[name] = moved
    verdict, verdict_moved = _parted(data.get("verdict") or {}, VERDICT_KEYS, deep=False)
    environment, samples = _parted(data.get("environment") or {}, NOISE_KEYS)
    first = {key: data.get(key) for key in FIRST}
    first.update(methods=methods, verdict=verdict, environment=environment)
    laid = {k: v for k, v in first.items() if v is not None and (v != {} or k == "methods")}
    laid.update({k: v for k, v in data.items() if k not in FIRST})
    diagnostics = {"methods": found, "verdict": verdict_moved, "environment": samples}
    diagnostics = {key: value for key, value in diagnostics.items() if value}
    return {**laid, DIAGNOSTICS: diagnostics} if diagnostics else laid


def merged(data: dict) -> dict:
    """A profile as read, its ``diagnostics`` merged back where they were moved from
    (the deployable part wins where both hold a value)."""
    diagnostics = data.get(DIAGNOSTICS)
    if not isinstance(diagnostics, dict):
        return data  # none, or not a mapping: the schema says so
    rest = {key: value for key, value in data.items() if key != DIAGNOSTICS}
    return _merge(rest, diagnostics)


def where_written(problem: str, diagnostics: object) -> str:
    """A schema problem (``dotted.path: what``, the path in the merged profile) with the
    path where the file holds it: under ``diagnostics`` where that section holds it."""
    where, _, what = problem.partition(": ")
    node = diagnostics
    if not isinstance(node, dict):
        return problem
    for key in where.replace("[", ".[").split("."):
        if key.startswith("[") or not isinstance(node, dict):
            break  # within a value the section holds whole
        if key not in node:
            return problem
        node = node[key]
    return f"{DIAGNOSTICS}.{where}: {what}"


def with_comment(text: str) -> str:
    """The YAML text with a comment opening its diagnostics section."""
    marker = f"\n{DIAGNOSTICS}:"
    head, found, tail = text.partition(marker)
    return f"{head}\n{DIAGNOSTICS_COMMENT.rstrip()}{marker}{tail}" if found else text


def _parted(block: dict, keys: frozenset[str], deep: bool = True) -> tuple[dict, dict]:
    """``block`` without ``keys`` (within nested mappings too, when ``deep``), and what
    was taken out, in the same shape (less the empty ones)."""
    kept: dict[str, Any] = {}
    moved: dict[str, Any] = {}
    for key, value in block.items():
        if key in keys:
            if value not in (None, [], {}):  # each of these keys' default: read back so
                moved[key] = value
        elif deep and isinstance(value, dict):
            kept[key], inner = _parted(value, keys)
            if inner:
                moved[key] = inner
        else:
            kept[key] = value
    return kept, moved


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(out.get(key), dict) and isinstance(value, dict):
            out[key] = _merge(out[key], value)
        elif out.get(key) is None:
            out[key] = value
    return out
