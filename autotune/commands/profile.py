"""`autotune profile`: what can fail at once is checked before the long run starts, and
what to run after it is said."""

from __future__ import annotations

import contextlib
import dataclasses
import shlex
from collections.abc import Collection, Iterator
from pathlib import Path

from autotune import plan
from autotune.commands import inputs, interrupt, study_kept
from autotune.errors import AutotuneError
from autotune.export import export_profile
from autotune.files import check_writable
from autotune.measure.noise import set_threads
from autotune.methods import registry
from autotune.models import resolve_model
from autotune.models.loading import placement
from autotune.profile.schema import ProfileBase
from autotune.profiling import ProfileRequest, run_profile
from autotune.profiling.request import default_out
from autotune.studies.cluster import ray_target
from autotune.studies.workers import check_trial_gpus


def profile_checked(request: ProfileRequest) -> tuple[ProfileBase, Path]:
    """The profile run and where it was written, after the checks that take no time: the
    output path (before the model, the heads and the study database), torch's threads
    (set deliberately: recorded in the profile), --dtype and --device (a GPU asked for and
    absent is one line now), the GPUs a trial reserves, the Ray cluster's address (a bad
    one fails now, not after calibration), the prompts' splits, the model's context and the
    heads given. Stopped before its end, it wrote no profile, and says what became of the
    study database."""
    if request.out is not None:
        check_writable(request.out)
    set_threads(request.threads)
    dtype, device = placement(request.dtype, request.device)
    check_trial_gpus(request.workers.gpus_per_trial, device)
    request = dataclasses.replace(request, workers=request.workers.on_device(device))
    ray_target(request.workers.ray_address)
    inputs.check_profile_prompts(request.prompts, request.heldback_prompts)
    answer_tokens = max(request.max_new_tokens, plan.ANSWER_TOKENS)
    inputs.check_context_room(request.model, request.model_path, answer_tokens, "--max-new-tokens")
    inputs.check_heads_fit(request.heads, request.model, request.model_path)
    interrupt.tell("no profile was written")
    out = request.out or default_out(resolve_model(request.model, request.model_path).name)
    with study_kept.kept_or_removed(request.storage), _said_if_written(out):
        profile, path = run_profile(dataclasses.replace(request, dtype=dtype, device=device))
    interrupt.tell(f"the profile was written ({path})")
    return profile, path


@contextlib.contextmanager
def _said_if_written(out: Path) -> Iterator[None]:
    """Stopped after the profile was written (its plot comes after it), the interruption
    says so."""
    before = _written_at(out)
    try:
        yield
    except BaseException:
        if _written_at(out) != before:
            interrupt.tell(f"the profile was written ({out}), its verdict plot was not")
        raise


def _written_at(path: Path) -> int | None:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return None


NOTHING_TO_EXPORT = (
    "next: no method is recommended, so there is nothing to export: serve the model with "
    "plain decoding, or profile again with a larger --budget or other --methods"
)


def next_steps(
    profile: ProfileBase, path: Path, engines: Collection[str] | None = None
) -> list[str]:
    """What to run after the profile: the export command of each engine its recommended
    method exports to (of ``engines``, the ones deployed to, when given), each export
    tried now so that no command shown is refused; with no recommendation, one line on
    what to do instead."""
    method = profile.recommended
    if method == "none":
        return [NOTHING_TO_EXPORT]
    shown = shlex.quote(str(path))
    offered = [
        engine
        for engine in registry.method(method).exporters
        if (engines is None or engine in engines) and _exports(profile, engine)
    ]
    if not offered and engines:  # deployed to these engines only: each says why not
        return [f"next: no {engine} export: {_refusal(profile, engine)}" for engine in engines]
    if not offered:
        return [
            f"next: no engine takes {method}'s export as measured here; "
            f"`autotune export {shown} --engine ENGINE` says why"
        ]
    commands = [f"  autotune export {shown} --engine {engine}" for engine in offered]
    return [f"next: export {method}'s settings for the engine you serve with:", *commands]


def _exports(profile: ProfileBase, engine: str) -> bool:
    return _refusal(profile, engine) is None


def _refusal(profile: ProfileBase, engine: str) -> str | None:
    """Why ``export --engine ENGINE`` refuses the profile's recommendation (None: it
    does not)."""
    try:
        export_profile(profile, engine)
    except AutotuneError as exc:
        return str(exc)
    return None
