"""`autotune heads train`: torch's threads and the placement settled before the job, and
the heads folder it makes removed if it does not finish."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from autotune.commands import inputs, interrupt
from autotune.errors import AutotuneError
from autotune.measure.noise import set_threads
from autotune.models.loading import placement
from autotune.training.job import HeadsJob, cached_heads_folder, default_options, run_heads_train


def train_heads_checked(job: HeadsJob, threads: int | None) -> tuple[Any, Path]:
    """The trained heads' result and folder. Torch's thread count is set deliberately, and
    --dtype and --device are resolved at once, before any long work: a GPU asked for and
    absent is one line now, not after the prompts and heads are checked. Stopped or
    failed, the heads folder is removed if this command made it (never one that was
    there before), and the interruption says so."""
    set_threads(threads)
    dtype, device = placement(job.dtype, job.device)
    interrupt.tell("no heads were written")
    answer_tokens = (job.options or default_options(job.kind)).max_new_tokens
    folder = heads_folder(job, answer_tokens)
    if folder is None:  # the model cannot be resolved: the job says why, in its order
        return run_heads_train(dataclasses.replace(job, dtype=dtype, device=device))
    with interrupt.removed_unless_finished(folder, "the heads folder"):
        return run_heads_train(dataclasses.replace(job, dtype=dtype, device=device))


def heads_folder(job: HeadsJob, answer_tokens: int) -> Path | None:
    """Where the job writes its heads: ``--out``, else autotune's heads cache for the
    model (None: the model cannot be resolved), once the model's context is known to hold
    the answers the heads learn from."""
    from autotune.models import resolve_model
    from autotune.models.registry import fingerprint

    try:
        resolved = resolve_model(job.model, job.model_path)
    except AutotuneError:
        return job.out
    inputs.check_context_room(job.model, job.model_path, answer_tokens, "--max-new-tokens")
    return job.out or cached_heads_folder(fingerprint(resolved), job.kind)
