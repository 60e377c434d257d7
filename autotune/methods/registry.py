"""The one registry of speculative methods: every list of method names in autotune (CLI
choices, profile validation, bench, CAPE, export) is read from here.

A method registers once, under one spelling (``self_spec``, ``medusa``, ...) used in the
CLI, the profile, study names and exports. The built-in methods are the packages of
``autotune.methods`` named in ``BUILTIN``; they are imported on first use, so that
importing the registry costs nothing.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from autotune.errors import AutotuneError

if TYPE_CHECKING:
    from autotune.methods.base import Entry, Expansion, Method

# The registry lines: one per method package (autotune/methods/<name>/, which defines ENTRY).
BUILTIN = (
    "self_spec",
    "medusa",
    "eagle",
    "ngram",
    "glide",
    "cape",
)

_ENTRIES: dict[str, Entry] = {}
_loaded = False
_version = 0  # bumped on every registration: the profile schema is rebuilt when it moves


def register(entry: Entry) -> Entry:
    """Add a method (or replace one of the same name); returns it."""
    global _version
    _ENTRIES[entry.name] = entry
    _version += 1
    return entry


def unregister(name: str) -> None:
    global _version
    _load_builtin()
    if _ENTRIES.pop(name, None) is not None:
        _version += 1


def version() -> int:
    _load_builtin()
    return _version


def entries() -> dict[str, Entry]:
    """Every registered entry by name: the drafting methods, then expansions (CAPE)."""
    _load_builtin()
    return dict(_ENTRIES)


def names() -> list[str]:
    return list(entries())


def methods() -> dict[str, Method]:
    """The drafting methods (each has a block in the profile)."""
    from autotune.methods.base import Method

    return {name: e for name, e in entries().items() if isinstance(e, Method)}


def expansions() -> dict[str, Expansion]:
    """What widens another method's drafts (CAPE)."""
    from autotune.methods.base import Expansion

    return {name: e for name, e in entries().items() if isinstance(e, Expansion)}


def normalise(name: str) -> str:
    """A user's spelling (``Self-Spec``) as the registered one (``self_spec``)."""
    return name.strip().lower().replace("-", "_")


def get(name: str) -> Entry:
    key = normalise(name)
    found = entries().get(key)
    if found is None:
        raise AutotuneError(f"unknown method '{name}': choose from {', '.join(names())}")
    return found


def method(name: str) -> Method:
    """A drafting method (not an expansion such as CAPE), by any spelling of its name."""
    found = get(name)
    drafting = methods()
    if found.name not in drafting:
        raise AutotuneError(
            f"{found.name} widens other methods' drafts and drafts nothing of "
            f"its own: choose from {', '.join(drafting)}"
        )
    return drafting[found.name]


def time_share(name: str, step: str) -> float:
    """The share of its tuning time the method ``name`` gives ``step`` (its entry's
    ``time_shares``)."""
    return get(name).time_shares[step]


def _load_builtin() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for module in BUILTIN:
        register(importlib.import_module(f"autotune.methods.{module}").ENTRY)
