"""`autotune heads train`: torch's threads and the placement settled before the job."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from autotune.measure.noise import set_threads
from autotune.models.loading import placement
from autotune.training.job import HeadsJob, run_heads_train


def train_heads_checked(job: HeadsJob, threads: int | None) -> tuple[Any, Path]:
    """The trained heads' result and folder. Torch's thread count is set deliberately, and
    --dtype and --device are resolved at once, before any long work: a GPU asked for and
    absent is one line now, not after the prompts and heads are checked."""
    set_threads(threads)
    dtype, device = placement(job.dtype, job.device)
    return run_heads_train(dataclasses.replace(job, dtype=dtype, device=device))
