"""What a process builds once and keeps: the target, heads, tracers.

Ray Tune reuses a trial's worker (actor) for the next trial of the same size
(``reuse_actors=True``), so what is built here lives as long as the worker does; in the
main process it lives for the command.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

T = TypeVar("T")
_STATE: dict = {}
_BUILT: Counter = Counter()  # kind (a key's first item) -> times built in this process


def cached(key: Hashable, build: Callable[[], T]) -> T:
    if key not in _STATE:
        _STATE[key] = build()
        _BUILT[key[0] if isinstance(key, tuple) else key] += 1
    return _STATE[key]


def peek(key: Hashable) -> Any:
    """What ``key`` holds, if it was built in this process; None otherwise."""
    return _STATE.get(key)


def built(kind: str) -> int:
    """How many times this process built state of this kind ("target": loads)."""
    return _BUILT[kind]
