"""The trial's side of a study run through Ray Tune: the objective wrapped so that every
outcome (a result, a crash, out of memory, NaN) reaches the searcher as a result, and
the keys every such result carries. Runs in Ray's workers."""

from __future__ import annotations

import math
import os
import socket
import sys
from collections.abc import Callable, Iterator

ATTR_PREFIX = "attr_"
# Keys of every reported result: whether it is the trial's final one (a trial stopped
# after a result that is not was pruned), and how many results came before it, itself
# included (Tune's training_iteration: the step of Optuna's intermediate values).
FINAL = "final"
FIDELITY = "fidelity"
# A progressive objective's result with this key (the reason, in words) is its last: the
# trial stopped itself early, and is pruned as if a scheduler had stopped it.
STOPPED = "stopped"


def _results(objective, config: dict) -> Iterator[dict]:
    """The results of a trial: those of a progressive objective's ``steps`` as they come,
    or a plain objective's one; the last is final."""
    steps = getattr(objective, "steps", None)
    if steps is None:
        yield objective(config)
        return
    yield from steps(config)


def reporting(objective: Callable[[dict], dict], threads: int | None = None):
    """Wrap an objective so that every outcome reaches the searcher as a result: a
    crash inside the objective becomes a NaN objective with its reason attached. An
    objective with a ``steps(config)`` method (``methods.studies.Progressive``) reports
    each result it yields; a scheduler may stop it after any but the last."""

    def trainable(config: dict) -> None:
        from ray import tune

        _set_threads(threads)
        full = getattr(objective, "fidelities", 1)  # results of a whole trial
        done, last = 0, None
        try:
            for result in _results(objective, config):
                done, last = done + 1, result
                tune.report(_row(result, done, final=done >= full))
            if last is None:
                raise RuntimeError("the objective gave no result")
        except Exception as exc:  # recorded as a failed trial; the study goes on
            done, last = done + 1, {"objective": math.nan, "fail_reason": _failure(exc)}
            tune.report(_row(last, done, final=True))
            return
        if done < full and STOPPED not in last:  # ended early: its last result is final
            tune.report(_row(last, done + 1, final=True))
        # (a result with STOPPED was reported as not final: the trial is pruned)

    trainable.__name__ = getattr(objective, "__name__", type(objective).__name__)
    return trainable


def _row(result: dict, done: int, *, final: bool) -> dict:
    from autotune.process_cache import built

    # which worker ran it, and how often that worker has loaded the target (once)
    result = {
        **result,
        "worker": f"{socket.gethostname()}:{os.getpid()}",
        "target_loads": built("target"),
    }
    return {
        "objective": result.get("objective", math.nan),
        FINAL: final,
        FIDELITY: done,
        **{ATTR_PREFIX + k: v for k, v in result.items()},
    }


def _failure(exc: Exception) -> str:
    """The reason of a failed trial; out of memory is said so, and memory given back."""
    reason = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        import gc

        gc.collect()
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            torch.cuda.empty_cache()
        reason = f"out of memory: {reason}"
    return reason[:500]


def _set_threads(threads: int | None) -> None:
    """Torch threads of this trial: ``threads``, or the cores it reserved (Ray sets
    OMP_NUM_THREADS to those when it starts a worker, before torch is imported)."""
    if threads:
        import torch

        torch.set_num_threads(threads)
        return
    loaded = sys.modules.get("torch")
    if loaded is None:
        return
    import ray

    cpus = ray.get_runtime_context().get_assigned_resources().get("CPU")
    if cpus:
        loaded.set_num_threads(max(1, int(cpus)))
