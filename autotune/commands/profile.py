"""`autotune profile`: what can fail at once is checked before the long run starts."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from autotune.files import check_writable
from autotune.measure.noise import set_threads
from autotune.models.loading import placement
from autotune.profile.schema import ProfileBase
from autotune.profiling import ProfileRequest, run_profile
from autotune.studies.cluster import ray_target
from autotune.studies.workers import check_trial_gpus


def profile_checked(request: ProfileRequest) -> tuple[ProfileBase, Path]:
    """The profile run and where it was written, after the checks that take no time: the
    output path (before the model, the heads and the study database), torch's threads
    (set deliberately: recorded in the profile), --dtype and --device (a GPU asked for and
    absent is one line now), the GPUs a trial reserves, and the Ray cluster's address (a
    bad one fails now, not after calibration)."""
    if request.out is not None:
        check_writable(request.out)
    set_threads(request.threads)
    dtype, device = placement(request.dtype, request.device)
    check_trial_gpus(request.workers.gpus_per_trial, device)
    ray_target(request.workers.ray_address)
    return run_profile(dataclasses.replace(request, dtype=dtype, device=device))
