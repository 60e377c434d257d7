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
        cls, spec: str, model_path: str | None = None, dtype: str = "auto", device: str = "auto"
    ) -> TargetRef:
        """Paths made absolute: Ray runs each trial in a working folder of its own. Device
        and dtype resolved here, once, in the main process (``auto`` chosen for this
        machine, a missing GPU refused): every worker then loads the same dtype."""
        from autotune.models.loading import placement

        def absolute(path: str | None) -> str | None:
            return os.path.abspath(path) if path and os.path.exists(path) else path

        dtype, device = placement(dtype, device)
        return cls(absolute(spec) or spec, absolute(model_path), dtype, device)

    def load(self):
        from autotune.hardware import process_device
        from autotune.models import load_target

        # a Ray trial loads on the GPU it reserved, not the main process's index
        device = process_device(self.device)
        return cached(
            ("target", self),
            lambda: load_target(self.spec, self.model_path, self.dtype, device),
        )

    def runner(self):
        from autotune.engine.runner import Runner

        return cached(("runner", self), lambda: Runner(self.load().model))
