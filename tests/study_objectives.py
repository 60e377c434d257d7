"""What the trials of ``tests/test_studies_scale.py`` run, in Ray's workers. The workers
cannot import the tests' modules: that module's cluster ships this one by value."""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path


def value_of(params: dict) -> float:
    return -((params["x"] - 3) ** 2) - (params["y"] - 0.5) ** 2


@dataclass
class Slow:
    """A cheap objective that takes its time; ``marks`` gets one file per trial start,
    named by the Ray node it runs on."""

    seconds: float
    marks: str | None = None

    def __call__(self, config: dict) -> dict:
        if self.marks:
            import ray

            node = ray.get_runtime_context().get_node_id()
            Path(self.marks, f"{node}-{os.getpid()}-{time.time_ns()}").touch()
        start = time.time()
        time.sleep(self.seconds)
        return {"objective": value_of(config), "start": start, "end": time.time()}


@dataclass
class TinyTarget:
    """A trial that needs the target: the tiny LLaMA, loaded once per worker. Each trial
    marks its start in ``marks`` and ends only once a trial of another worker has started
    (or after 60 s): two workers running side by side overlap, one alone does not."""

    ref: object  # autotune.models.ref.TargetRef
    marks: str

    def __call__(self, config: dict) -> dict:
        import torch

        model = self.ref.load().model
        start = time.time()
        Path(self.marks, f"{os.getpid()}-{time.time_ns()}").touch()
        with torch.no_grad():
            logits = model(torch.tensor([[1, 5, 9, 3 + config["x"]]])).logits
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if any(not p.name.startswith(f"{os.getpid()}-") for p in Path(self.marks).iterdir()):
                break
            time.sleep(0.05)  # polling, with a deadline
        assert torch.isfinite(logits).all()
        return {"objective": value_of(config), "start": start, "end": time.time()}


def faulty(config: dict) -> dict:
    x = config["x"]
    if x == 1:
        return {"objective": math.nan}
    if x == 2:
        raise RuntimeError("boom at x=2")
    if x == 3:
        raise MemoryError("cannot allocate 64 GiB")
    if x == 4:
        os._exit(3)  # the worker process dies under the trial
    return {"objective": float(x)}
