"""How a fixed-shape step becomes what a run replays: a CUDA graph, a
``torch.compile(mode="reduce-overhead")`` of it, or the step itself (eager; always so
off CUDA). Shared by the target's step (``engine.static``) and the heads' own steps, so
that each records the same way and a refusal reads the same."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from autotune.progress import say

HOWS = ("graph", "compile", "eager")
# "0": a GPU runner runs eagerly unless asked otherwise; "1": a CPU runner runs the steps
# too (eagerly: the GPU's code path, end to end, where no GPU is at hand)
SWITCH_ENV = "AUTOTUNE_STATIC"
WARMUP_RUNS = 3  # eager runs on a side stream before a capture, as torch's docs ask
# dynamo keeps 8 compiled entries per code object by default; each bucket and variant of
# a step is one entry of the same code
RECOMPILE_LIMIT = 128

Run = Callable[[], None]


class Recorder:
    """Turns steps (``functools.partial`` of a function over fixed buffers) into runs, as
    ``how`` says; graphs share one memory pool. After a refusal, ``failed`` says why and
    no step is recorded again: the caller runs its eager layers."""

    def __init__(self, device: torch.device, how: str = "graph"):
        if how not in HOWS:
            raise ValueError(f"how must be one of {', '.join(HOWS)}, not {how!r}")
        self.device = device
        self.how = how if device.type == "cuda" else "eager"
        self.pool: Any = None  # the captured graphs' shared memory pool
        self.failed: str | None = None

    def make(self, step: functools.partial, statics: list[torch.Tensor], what: str) -> Run | None:
        """``step`` as a run, or None where torch or the driver refused (one warning
        line, then ``failed``): rather a slower run than a run stopped over its speed.
        ``statics``: every tensor it reads or writes (torch.compile must see them at
        fixed addresses); ``what``: the step, as the warning names it. The step's
        buffers must hold idle inputs: recording runs it a few times."""
        if self.how == "eager":
            return step
        try:
            return self._graph(step) if self.how == "graph" else self._compiled(step, statics)
        except Exception as error:
            verb = "record a CUDA graph of" if self.how == "graph" else "torch.compile"
            first_line = (str(error).strip().splitlines() or [""])[0]
            self.failed = f"{type(error).__name__}: {first_line}"[:300]
            say(
                f"[yellow]warning: could not {verb} {what} ({self.failed}); the engine "
                f"runs eagerly, slower than a serving engine's step (set {SWITCH_ENV}=0 to "
                f"skip the attempt)[/yellow]"
            )
            return None

    def forget(self) -> None:
        """The recorded runs were dropped (their storage replaced): a fresh pool."""
        self.pool = None

    def _graph(self, step: functools.partial) -> Run:
        """The step recorded as a CUDA graph: warmed up on a side stream, then captured."""
        current = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            for _ in range(WARMUP_RUNS):
                step()
        current.wait_stream(side)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        # a step copies its outputs into its own buffers inside the graph, so one
        # graph's temporaries can share the pool with another's (never run at once)
        with torch.cuda.graph(graph, pool=self.pool):
            step()
        return graph.replay

    def _compiled(self, step: functools.partial, statics: list[torch.Tensor]) -> Run:
        """The step under ``torch.compile(mode="reduce-overhead")``, whose CUDA graphs
        must see every tensor the step reads or writes at a fixed address."""
        import torch._dynamo

        for tensor in statics:
            torch._dynamo.mark_static_address(tensor)
        limit = torch._dynamo.config.recompile_limit
        torch._dynamo.config.recompile_limit = max(limit, RECOMPILE_LIMIT)
        compiled = torch.compile(step.func, mode="reduce-overhead", fullgraph=True, dynamic=False)
        for _ in range(WARMUP_RUNS):  # compiles, then records its graph
            compiled(*step.args, **step.keywords)
        return lambda: compiled(*step.args, **step.keywords)
