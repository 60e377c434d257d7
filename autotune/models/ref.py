"""How any process (the main one, a Ray worker) finds and loads the target: the same
arguments the user gave, loaded once per process."""

from __future__ import annotations

import os
from dataclasses import dataclass

from autotune.process_cache import cached


@dataclass(frozen=True)
class TargetRef:
    spec: str
    model_path: str | None = None
    dtype: str = "float32"
    device: str = "cpu"

    @classmethod
    def for_user(
        cls, spec: str, model_path: str | None = None, dtype: str = "float32", device: str = "cpu"
    ) -> TargetRef:
        """Paths made absolute: Ray runs each trial in a working folder of its own."""

        def absolute(path: str | None) -> str | None:
            return os.path.abspath(path) if path and os.path.exists(path) else path

        return cls(absolute(spec) or spec, absolute(model_path), dtype, device)

    def load(self):
        from autotune.models import load_target

        return cached(
            ("target", self),
            lambda: load_target(self.spec, self.model_path, self.dtype, self.device),
        )

    def runner(self):
        from autotune.engine.runner import Runner

        return cached(("runner", self), lambda: Runner(self.load().model))
