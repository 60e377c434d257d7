"""What every fixed-shape step keeps besides its arithmetic (the target's,
``engine.static``; the drafting heads', ``heads.head_step``): its KV storage, one set of
buffers per shape (lanes, bucket), one run per shape and variant, recorded at its first
call (``engine.capture``), and the few most recently used variants' runs (a search tries
a new skip mask or draft vocabulary every trial; keeping them all would hold their
graphs). A subclass makes a shape's buffers (``new_buffers``), the step over them
(``step``: a ``functools.partial`` the recorder can replay) and says what the step reads
and writes (``statics``); ``title`` names it in a warning."""

from __future__ import annotations

import collections
import functools
from collections.abc import Hashable
from typing import Any

import torch

from autotune.engine import buckets
from autotune.engine.capture import Recorder, Run
from autotune.engine.static_cache import LaneStorage

# Variants whose runs are kept besides those never dropped (``tracked``): a decoding uses
# one (its drafter's); dropping the least recent bounds the graphs held while a search runs
KEPT_VARIANTS = 4


class RecordedSteps:
    """A step's storage, buffers and runs (see the module's docstring)."""

    title = "a fixed-shape step"

    def __init__(self, device: torch.device, how: str, storage: LaneStorage):
        self.recorder = Recorder(device, how)
        self.storage = storage
        self.buffers: dict[tuple[int, int], Any] = {}
        self._runs: dict[tuple[int, int, Hashable], Run] = {}  # (lanes, bucket, variant)
        self._recent: collections.OrderedDict[Hashable, None] = collections.OrderedDict()
        self._version: Any = None  # the storage's, when the buffers and runs were made
        self.calls: collections.Counter[int] = collections.Counter()  # bucket -> runs
        # sequences in one run (> 1) -> runs
        self.batched: collections.Counter[int] = collections.Counter()

    @property
    def how(self) -> str:
        return self.recorder.how

    @property
    def failed(self) -> str | None:
        """Why recording failed (the caller runs eagerly from then on), or None."""
        return self.recorder.failed

    @property
    def scratch(self) -> int:
        """The scratch column of every lane (the last)."""
        return self.storage.columns - buckets.SCRATCH_COLUMNS

    def new_buffers(self, lanes: int, size: int) -> Any:
        raise NotImplementedError

    def step(self, buffer: Any, variant: Any) -> functools.partial:
        raise NotImplementedError

    def statics(self, buffer: Any, variant: Any) -> list[torch.Tensor]:
        raise NotImplementedError

    def tracked(self, variant: Any) -> bool:
        """Whether ``variant``'s runs may be dropped for more recent ones."""
        return True

    def follow(self, version: Any) -> None:
        """Drop the buffers and runs made over storage since replaced (``version``: the
        storages' versions now)."""
        if version != self._version:
            self._version = version
            self.buffers.clear()
            self._runs.clear()
            self.recorder.forget()

    def ran(self, size: int, sequences: int) -> None:
        """Count a run of the step (the tests and the GPU check read the counts)."""
        self.calls[size] += 1
        if sequences > 1:
            self.batched[sequences] += 1

    def run_for(self, lanes: int, size: int, variant: Hashable) -> Run | None:
        """The step of this shape and variant, made (on CUDA: recorded) at its first call;
        None where the recording was refused (said once: the caller runs eagerly)."""
        self._keep(variant)
        if (lanes, size, variant) in self._runs:
            return self._runs[lanes, size, variant]
        if (lanes, size) not in self.buffers:
            self.buffers[lanes, size] = self.new_buffers(lanes, size)
        buffer = self.buffers[lanes, size]
        step = self.step(buffer, variant)
        buffer.load_idle(self.scratch)  # recording writes the scratch columns only
        what = f"{self.title}'s {size}-row step" + (f" over {lanes} sequences" if lanes > 1 else "")
        run = self.recorder.make(step, self.statics(buffer, variant), what)
        if run is not None:
            self._runs[lanes, size, variant] = run
        return run

    def _keep(self, variant: Hashable) -> None:
        """Mark ``variant`` as the most recently used; past ``KEPT_VARIANTS`` tracked ones,
        the least recent one's runs and outputs (``drop`` of each buffers) go."""
        if not self.tracked(variant):
            return
        self._recent[variant] = None
        self._recent.move_to_end(variant)
        while len(self._recent) > KEPT_VARIANTS:
            dropped, _ = self._recent.popitem(last=False)
            self._runs = {key: run for key, run in self._runs.items() if key[2] != dropped}
            for buffer in self.buffers.values():
                buffer.drop(dropped)
