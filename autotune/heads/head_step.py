"""What the drafting heads' fixed-shape steps share (the EAGLE head's,
``heads.static_head``; GLIDE's draft's, ``heads.static_glide``): KV storage of their own
lent lane by lane, one step per shape (lanes, bucket of rows) and draft projection,
recorded at its first call as the target's step is (``engine.capture``), and the four
most recent projections kept (a study tries several draft vocabularies)."""

from __future__ import annotations

import collections
import functools
from typing import Any

import torch
from torch import nn

from autotune.engine import buckets
from autotune.engine.capture import Recorder, Run
from autotune.engine.runner import visibility
from autotune.engine.static import KEPT_VARIANTS
from autotune.engine.static_cache import LaneStorage


class HeadBuffers:
    """One shape's buffers of a head's step, made once: ``lanes`` x ``size`` rows, lane by
    lane. ``columns``: the column each row writes in its lane of the head's storage;
    ``seen`` [lanes, size, columns]: the columns of its lane each row sees (True = may
    attend), loaded from the call's mask, which may span the cached prefix; ``logits``:
    per draft projection (its weight's module), ``logit_rows`` rows of draft logits.
    A subclass adds the head's own inputs and outputs."""

    def __init__(self, lanes: int, size: int, columns: int, like: torch.Tensor, logit_rows: int):
        device = like.device
        self.lanes, self.size, self.logit_rows = lanes, size, logit_rows
        self.positions = torch.zeros(lanes, size, dtype=torch.long, device=device)
        self.columns = torch.zeros(lanes, size, dtype=torch.long, device=device)
        self.seen = torch.zeros(lanes, size, columns, dtype=torch.bool, device=device)
        self.rows = torch.arange(size, device=device)
        self.logits: dict[nn.Linear, torch.Tensor] = {}

    def tensors(self) -> list[torch.Tensor]:
        own = [v for v in vars(self).values() if isinstance(v, torch.Tensor)]
        return own + list(self.logits.values())

    def logits_for(self, linear: nn.Linear) -> torch.Tensor:
        if linear not in self.logits:
            weight = linear.weight
            self.logits[linear] = weight.new_zeros(self.logit_rows, weight.shape[0])
        return self.logits[linear]

    def load_idle(self, scratch: int) -> None:
        """Every row padding: it writes its lane's scratch column and sees only that one
        (the warm-up and capture runs, while sequences' entries sit in the storage)."""
        self.columns.fill_(scratch)
        self.seen.fill_(False)
        self.seen[:, :, scratch] = True

    def load_rows(self, lane: int, positions: torch.Tensor, prefix: int, mask) -> None:
        """A call's rows in ``lane``: at ``positions``, writing at ``prefix`` onward and
        seeing what ``mask`` allows (as ``Runner.forward`` takes it). On the device, no
        sync."""
        n = positions.shape[0]
        self.positions[lane, :n].copy_(positions)
        torch.add(self.rows[:n], prefix, out=self.columns[lane, :n])
        seen = self.seen[lane, :n]
        seen.fill_(False)
        visible = visibility(mask, prefix, n, seen.device)  # None: one row, sees everything
        seen[:, : prefix + n] = True if visible is None else visible


class HeadStep:
    """A head's steps and storage. A subclass makes a shape's buffers (``new_buffers``),
    the step over them (``step``: a ``functools.partial`` the recorder can replay) and
    says what the step reads and writes (``statics``); ``title`` names it in a warning."""

    title = "a drafting head"

    def __init__(self, device: torch.device, how: str, storage: LaneStorage):
        self.recorder = Recorder(device, how)
        self.storage = storage
        self.buffers: dict[tuple[int, int], Any] = {}
        # (lanes, bucket, projection) -> run its step once
        self._runs: dict[tuple[int, int, nn.Linear], Run] = {}
        self._projections: collections.OrderedDict[nn.Linear, None] = collections.OrderedDict()
        self.calls: collections.Counter[int] = collections.Counter()  # bucket -> runs
        self.batched: collections.Counter[int] = collections.Counter()  # lanes (> 1) -> runs

    @property
    def failed(self) -> str | None:
        """Why recording failed (the drafter runs the eager head from then on), or None."""
        return self.recorder.failed

    @property
    def scratch(self) -> int:
        return self.storage.columns - buckets.SCRATCH_COLUMNS

    def new_buffers(self, lanes: int, size: int) -> HeadBuffers:
        raise NotImplementedError

    def step(self, buffer: Any, linear: nn.Linear) -> functools.partial:
        raise NotImplementedError

    def statics(self, buffer: Any, linear: nn.Linear) -> list[torch.Tensor]:
        raise NotImplementedError

    def forget(self) -> None:
        """Drop the buffers and runs: they were made over storage since replaced."""
        self.buffers.clear()
        self._runs.clear()
        self.recorder.forget()

    def ran(self, size: int, lanes: int, sequences: int) -> None:
        """Count a run of the step (the tests and the GPU check read the counts)."""
        self.calls[size] += 1
        if sequences > 1:
            self.batched[lanes] += 1

    def replay(self, placed: list[Any], linear: nn.Linear) -> Any:
        """Run the step over calls that fit it (each with its ``rows`` and ``lane``): the
        shape that holds them, its buffers loaded. Returns the buffers, or None where
        the recording was refused (the head runs eagerly)."""
        size = buckets.bucket_for(max(call.rows.positions.shape[0] for call in placed))
        assert size is not None  # placing checked each count against the largest bucket
        lanes = buckets.lanes_for(max(call.lane for call in placed))
        run = self.run_for(lanes, size, linear)
        if run is None:
            return None
        buffer = self.buffers[lanes, size]
        buffer.load(placed, self.scratch)
        run()
        self.ran(size, lanes, len(placed))
        return buffer

    def run_for(self, lanes: int, size: int, linear: nn.Linear) -> Run | None:
        """The step of this shape and projection, made (on CUDA: recorded) at its first
        call; None where the recording was refused (said once: the head runs eagerly)."""
        self._keep(linear)
        if (lanes, size, linear) in self._runs:
            return self._runs[lanes, size, linear]
        if (lanes, size) not in self.buffers:
            self.buffers[lanes, size] = self.new_buffers(lanes, size)
        buffer = self.buffers[lanes, size]
        step = self.step(buffer, linear)
        buffer.load_idle(self.scratch)  # recording writes the scratch columns only
        what = f"{self.title}'s {size}-row step" + (f" over {lanes} sequences" if lanes > 1 else "")
        run = self.recorder.make(step, self.statics(buffer, linear), what)
        if run is not None:
            self._runs[lanes, size, linear] = run
        return run

    def _keep(self, linear: nn.Linear) -> None:
        """Mark a projection as the most recently used; past ``KEPT_VARIANTS``, the least
        recent one's runs and outputs go."""
        self._projections[linear] = None
        self._projections.move_to_end(linear)
        while len(self._projections) > KEPT_VARIANTS:
            dropped, _ = self._projections.popitem(last=False)
            self._runs = {key: run for key, run in self._runs.items() if key[2] is not dropped}
            for buffer in self.buffers.values():
                buffer.logits.pop(dropped, None)
