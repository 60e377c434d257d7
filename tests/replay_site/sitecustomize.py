"""Recorded steps replayed as a CUDA graph replays them, on a CPU, in a whole run.

``traced`` turns a step into a run that replays one trace of it (``make_fx`` over the
tensors the step names): whatever the step's Python read while it was traced stays as it
was, as in a CUDA graph, and only what lives in its tensors changes between runs.
``tests/test_replayed_steps.py`` uses it. With this folder on ``PYTHONPATH`` and
``AUTOTUNE_REPLAY_STEPS=1``, Python loads this file at start, in the process and in each
one it starts (Ray's trial workers among them): every runner then has its steps
(``AUTOTUNE_STATIC=1``), in torch's kernels (``AUTOTUNE_NATIVE=0``: the engine's C++
product is opaque to a trace), and every step of theirs is replayed from its trace::

    AUTOTUNE_REPLAY_STEPS=1 PYTHONPATH=tests/replay_site python -m pytest -k end_to_end
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

SWITCH_ENV = "AUTOTUNE_REPLAY_STEPS"


def traced(step: functools.partial, statics: list) -> Callable[[], None]:
    """``step`` traced once over ``statics`` (each tensor once), and a run of the trace."""
    from torch.fx.experimental.proxy_tensor import make_fx

    tensors = list({id(t): t for t in statics}.values())
    trace = make_fx(lambda *_: step(), tracing_mode="real")(*tensors)
    return lambda: trace(*tensors)


if os.environ.get(SWITCH_ENV) == "1":
    os.environ["AUTOTUNE_STATIC"] = "1"
    os.environ["AUTOTUNE_NATIVE"] = "0"
    from autotune.engine import capture

    capture.Recorder.make = lambda recorder, step, statics, what: traced(step, statics)
