"""The EAGLE head's drafting step at fixed shapes, which a GPU records once and replays.

A drafting call runs the head's decoder layer over a few rows (the pairs committed since
the last proposal, or one level of the draft tree) and projects them to draft logits: a
few dozen small kernels, whose launches cost a GPU more than their arithmetic. As the
target's step does (``engine.static``), this step has one shape per bucket of rows
(``engine.buckets``) and count of lanes: the call's features, token embeddings,
positions and mask are copied into buffers made once, each row writes its keys and
values at its column of the head's own KV storage (``engine.static_cache``: one lane a
sequence, padded rows at their lane's scratch column), attention reads every column
under a visibility mask taken from the call's, and the predicted features and their
draft logits (``DraftProjection``'s product) land in output buffers. Nothing in it reads
a value back to the host.

Unlike the target's calls, the head's carry masks over the cached prefix as well
([S, P + S]): an EAGLE-2 expansion sees the committed pairs and, of the draft entries in
the head's cache, only its own ancestors. So each row's mask spans every column of its
lane, loaded from the call's (``visibility``) rather than made from a prefix length.

The top-k selections that follow stay eager: their widths vary from parent to parent,
and the drafter reads them on the host at once to grow its tree.
"""

from __future__ import annotations

import collections
import functools
from typing import NamedTuple

import torch
from torch import nn

from autotune.engine import buckets, layers
from autotune.engine.capture import Recorder, Run
from autotune.engine.runner import additive, visibility
from autotune.engine.static import KEPT_VARIANTS, ColumnWriter
from autotune.engine.static_cache import LaneStorage, StaticCache
from autotune.heads.eagle import DraftProjection, EagleHead, HeadRows

# One call's outputs per sequence: predicted features [S, H], their draft logits [S, V']
Outputs = tuple[torch.Tensor, torch.Tensor]


class Placed(NamedTuple):
    """A call that fits the step: its rows, its cache's lane, its cached entries before them."""

    rows: HeadRows
    lane: int
    prefix: int


class HeadBuffers:
    """One shape's inputs and outputs, made once: ``lanes`` x ``size`` rows, lane by lane.
    ``columns``: the column each row writes in its lane; ``seen`` [lanes, size, columns]:
    the columns of its lane each row sees (True = may attend); ``logits``: per draft
    projection (its weight's module), the rows' draft logits."""

    def __init__(self, lanes: int, size: int, columns: int, head: EagleHead):
        weight = head.fc.weight
        device, hidden = weight.device, head.hidden_size
        self.lanes, self.size = lanes, size
        self.features = torch.zeros(lanes, size, hidden, dtype=weight.dtype, device=device)
        self.embeds = torch.zeros_like(self.features)
        self.positions = torch.zeros(lanes, size, dtype=torch.long, device=device)
        self.columns = torch.zeros(lanes, size, dtype=torch.long, device=device)
        self.seen = torch.zeros(lanes, size, columns, dtype=torch.bool, device=device)
        self.rows = torch.arange(size, device=device)
        self.predicted = torch.zeros(lanes * size, hidden, dtype=weight.dtype, device=device)
        self.logits: dict[nn.Linear, torch.Tensor] = {}

    def tensors(self) -> list[torch.Tensor]:
        own = [v for v in vars(self).values() if isinstance(v, torch.Tensor)]
        return own + list(self.logits.values())

    def logits_for(self, linear: nn.Linear) -> torch.Tensor:
        if linear not in self.logits:
            rows, vocab = self.predicted.shape[0], linear.weight.shape[0]
            self.logits[linear] = self.predicted.new_zeros(rows, vocab, dtype=linear.weight.dtype)
        return self.logits[linear]

    def load_idle(self, scratch: int) -> None:
        """Every row padding: it writes its lane's scratch column and sees only that one
        (the warm-up and capture runs, while sequences' entries sit in the storage)."""
        self.columns.fill_(scratch)
        self.seen.fill_(False)
        self.seen[:, :, scratch] = True

    def load(self, calls: list[Placed], scratch: int) -> None:
        """Each call's rows in its lane, writing at its prefix onward and seeing what its
        mask allows; every other row padding. Copies and fills on the device, no sync."""
        self.load_idle(scratch)
        for rows, lane, prefix in calls:
            n = rows.positions.shape[0]
            self.features[lane, :n].copy_(rows.features)
            self.embeds[lane, :n].copy_(rows.embeds)
            self.positions[lane, :n].copy_(rows.positions)
            torch.add(self.rows[:n], prefix, out=self.columns[lane, :n])
            seen = self.seen[lane, :n]
            seen.fill_(False)
            visible = visibility(rows.mask, prefix, n, seen.device)  # None: one row, sees all
            seen[:, : prefix + n] = True if visible is None else visible


class EagleStep:
    """The fixed-shape step over an EAGLE head's weights and the KV storage it lends (see
    the module's docstring). ``how``: as the target's step records (``engine.capture``)."""

    def __init__(self, head: EagleHead, how: str = "graph"):
        weight = head.fc.weight
        self.head, self.asked = head, how
        self.recorder = Recorder(weight.device, how)
        self.storage = LaneStorage(head.config, len(head.layers), weight.dtype, weight.device)
        self._version = 0  # the storage's, when the buffers and runs below were made
        self.buffers: dict[tuple[int, int], HeadBuffers] = {}
        # (lanes, bucket, projection) -> run its step once
        self._runs: dict[tuple[int, int, nn.Linear], Run] = {}
        self._projections: collections.OrderedDict[nn.Linear, None] = collections.OrderedDict()
        self.calls: collections.Counter[int] = collections.Counter()  # bucket -> runs
        self.batched: collections.Counter[int] = collections.Counter()  # lanes (> 1) -> runs

    @classmethod
    def of(cls, head: EagleHead, how: str = "graph") -> EagleStep:
        """The head's step, made once and kept on the head: each decoding makes a new
        drafter, and the recorded steps and the storage outlive it."""
        found = getattr(head, "_autotune_step", None)
        if not isinstance(found, cls) or found.asked != how:
            found = cls(head, how)
            object.__setattr__(head, "_autotune_step", found)  # not a submodule
        return found

    @property
    def failed(self) -> str | None:
        """Why recording failed (the drafter runs the eager head from then on), or None."""
        return self.recorder.failed

    @property
    def scratch(self) -> int:
        return self.storage.columns - buckets.SCRATCH_COLUMNS

    def lend(self, capacity: int) -> StaticCache:
        """A lane of the storage as the head's cache for one sequence
        (``LaneStorage.lend``); storage that grows drops what was made over the old one."""
        cache = self.storage.lend(capacity)
        if self.storage.version != self._version:
            self._version = self.storage.version
            self.buffers.clear()
            self._runs.clear()
            self.recorder.forget()
        return cache

    def place(self, calls: list[HeadRows]) -> list[Placed]:
        """The calls placed in the storage, or [] when they do not fit the step: each in
        its own lane of this storage, every layer at one length, a bucket for its rows,
        room before the scratch column, and a mask over its new rows or over the prefix
        and them (None: causal)."""
        placed: list[Placed] = []
        for rows in calls:
            cache, n, mask = rows.cache, rows.positions.shape[0], rows.mask
            if not isinstance(cache, StaticCache) or not self.storage.holds(cache):
                return []
            prefix = cache.lengths[0]
            if any(cache.lane == other.lane for other in placed):
                return []
            if any(length != prefix for length in cache.lengths):
                return []
            if not 1 <= n <= buckets.LARGEST or prefix + n > self.scratch:
                return []
            if mask is not None and tuple(mask.shape) not in ((n, n), (n, prefix + n)):
                return []
            placed.append(Placed(rows, cache.lane, prefix))
        return placed

    def forward(self, calls: list[HeadRows], projection: DraftProjection) -> list[Outputs] | None:
        """Per call, (predicted features [S, H], draft logits [S, V']) as the eager head
        and ``projection`` give them, its keys and values appended to its cache; None
        when the calls do not fit the step (``place``) or it could not be recorded."""
        placed = self.place(calls) if self.failed is None else []
        if not placed:
            return None
        size = buckets.bucket_for(max(rows.positions.shape[0] for rows in calls))
        assert size is not None  # place() checked each count against the largest bucket
        lanes = buckets.lanes_for(max(call.lane for call in placed))
        run = self._run(lanes, size, projection.linear)
        if run is None:  # the recording failed: said once, and the head runs eagerly
            return None
        buffer = self.buffers[lanes, size]
        buffer.load(placed, self.scratch)
        run()
        self.calls[size] += 1
        if len(placed) > 1:
            self.batched[lanes] += 1
        logits, outputs = buffer.logits[projection.linear], []
        for rows, lane, prefix in placed:
            n = rows.positions.shape[0]
            rows.cache.lengths = [prefix + n] * len(rows.cache.lengths)
            first = lane * size
            # copies: the next run overwrites the buffers, the drafter keeps its outputs
            outputs.append(
                (buffer.predicted[first : first + n].clone(), logits[first : first + n].clone())
            )
        return outputs

    def _run(self, lanes: int, size: int, linear: nn.Linear) -> Run | None:
        """The step of this shape and projection, made (on CUDA: recorded) at its first call."""
        self._keep(linear)
        if (lanes, size, linear) in self._runs:
            return self._runs[lanes, size, linear]
        if (lanes, size) not in self.buffers:
            self.buffers[lanes, size] = HeadBuffers(lanes, size, self.storage.columns, self.head)
        buffer = self.buffers[lanes, size]
        step = functools.partial(self.compute, buffer, linear, buffer.logits_for(linear))
        buffer.load_idle(self.scratch)  # recording writes the scratch columns only
        what = f"the EAGLE head's {size}-row step"
        what += f" over {lanes} sequences" if lanes > 1 else ""
        run = self.recorder.make(step, self._statics(buffer, linear), what)
        if run is not None:
            self._runs[lanes, size, linear] = run
        return run

    def _keep(self, linear: nn.Linear) -> None:
        """Mark a projection as the most recently used; past ``KEPT_VARIANTS`` (a study
        tries several draft vocabularies), the least recent one's steps are dropped."""
        self._projections[linear] = None
        self._projections.move_to_end(linear)
        while len(self._projections) > KEPT_VARIANTS:
            dropped, _ = self._projections.popitem(last=False)
            for key in [key for key in self._runs if key[2] is dropped]:
                del self._runs[key]
            for buffer in self.buffers.values():
                buffer.logits.pop(dropped, None)

    def compute(self, buffer: HeadBuffers, linear: nn.Linear, logits: torch.Tensor) -> None:
        """The step itself, over the buffers and the storage: the eager head's arithmetic
        (``EagleHead.pairs`` and ``decoder_layers``) with every shape fixed, the lanes as
        the batch of attention, then the draft projection's product into ``logits``."""
        head, lanes, size = self.head, buffer.lanes, buffer.size
        hidden = head.pairs(buffer.features, buffer.embeds)  # [lanes, size, H]
        rotation = layers.Rotation(head.rotary(hidden, buffer.positions))
        mask = additive(buffer.seen, hidden.dtype)
        assert mask is not None  # a tensor in, a tensor out
        writer = ColumnWriter(self.storage.keys, self.storage.values, buffer.columns)
        segment = layers.AttentionSegment(size, rotation, mask.unsqueeze(1), writer)
        predicted = head.decoder_layers(hidden, [segment]).view(lanes * size, -1)
        buffer.predicted.copy_(predicted)
        logits.copy_(layers.linear(predicted, linear))  # as ``DraftProjection`` multiplies

    def _statics(self, buffer: HeadBuffers, linear: nn.Linear) -> list[torch.Tensor]:
        """Every tensor the step reads or writes besides the head's parameters: the
        storage, the buffers, and the projection's weight (the target's lm_head, or a
        draft vocabulary's rows of it: not the head's)."""
        storage = [*self.storage.keys, *self.storage.values]
        return [*storage, *buffer.tensors(), linear.weight]
