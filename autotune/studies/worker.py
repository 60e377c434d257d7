"""State a Ray worker keeps between trials: the target is loaded once per process.

Ray Tune reuses a trial's worker (actor) for the next trial of the same size
(``reuse_actors=True``), so what is built here lives as long as the worker does.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable, TypeVar

T = TypeVar("T")
_STATE: dict = {}
_BUILT: Counter = Counter()  # kind (a key's first item) -> times built in this process


def cached(key, build: Callable[[], T]) -> T:
    if key not in _STATE:
        _STATE[key] = build()
        _BUILT[key[0] if isinstance(key, tuple) else key] += 1
    return _STATE[key]


def built(kind: str) -> int:
    """How many times this process built state of this kind ("target": loads)."""
    return _BUILT[kind]


@dataclass(frozen=True)
class TargetRef:
    """How a worker finds the target: the same arguments the user gave."""

    spec: str
    model_path: str | None = None
    dtype: str = "float32"
    device: str = "cpu"

    @classmethod
    def for_user(cls, spec: str, model_path: str | None = None, dtype: str = "float32",
                 device: str = "cpu") -> "TargetRef":
        """Paths made absolute: Ray runs each trial in a working folder of its own."""
        import os

        absolute = lambda p: os.path.abspath(p) if p and os.path.exists(p) else p  # noqa: E731
        return cls(absolute(spec), absolute(model_path), dtype, device)

    def load(self):
        from autotune.models import load_target

        return cached(("target", self), lambda: load_target(self.spec, self.model_path,
                                                            self.dtype, self.device))

    def runner(self):
        from autotune.engine.runner import Runner

        return cached(("runner", self), lambda: Runner(self.load().model))
