"""The GLIDE draft's drafting step at fixed shapes, which a GPU records once and replays.

A GLIDE drafting call runs the draft's few layers over a few rows (the tokens committed
since the last proposal, or the one token of a chain step) and projects its last row to
draft logits: kernels enough that their launches cost a GPU more than their arithmetic.
As the EAGLE head's step does (``heads.static_head``), this step has one shape per bucket
of rows and count of lanes (``engine.buckets``): the call's embeddings, positions and
masks are copied into buffers made once, each row writes its keys and values at its
column of the draft's own KV storage (``engine.static_cache``, padded rows at their
lane's scratch column), its self-attention reads every column of its lane under a mask
loaded from the call's, and its last row's draft logits land in an output buffer.

Each draft layer also cross-attends to one target layer's cache, up to the committed
length. The step reads the target step's storage (``engine.static``) as it lies, every
column of the lane, under a mask made on the device: the columns below each lane's
committed length (``cross_prefix``), and of those the ones the call's own cross mask
allows. A sequence's draft cache is lent the lane its target cache holds (``TiedLanes``),
so one lane number indexes both storages and the cross-attention takes a view of the
target's lanes: no lane map to gather a copy of the target's keys by, every step. The
recorded runs read both storages' memory, so they are dropped when either is replaced.

The exit rule (the chain stops where the draft's top probability falls below a
threshold) reads that probability on the host between steps, so it stays eager.
"""

from __future__ import annotations

import collections
import functools
import weakref
from typing import NamedTuple

import torch
from torch import nn

from autotune.engine import buckets, layers
from autotune.engine.capture import Recorder, Run
from autotune.engine.runner import additive, visibility
from autotune.engine.static import KEPT_VARIANTS, ColumnWriter, StaticStep
from autotune.engine.static_cache import LaneStorage, StaticCache
from autotune.heads.eagle import DraftProjection
from autotune.heads.glide import CrossSegment, GlideDraft, GlideRows


class TiedLanes(LaneStorage):
    """The draft's KV storage, lent lane by lane as the target's is: a sequence's draft
    cache takes the lane of its target cache (``lend_lane``), whatever lanes are free."""

    def lend_lane(self, capacity: int, lane: int) -> StaticCache:
        """Lane ``lane`` as an empty cache for ``capacity`` tokens; the storage grows to
        hold it (lanes and columns as ``LaneStorage.lend`` rounds them). A cache still in
        that lane gives it back: its target cache left the lane, so its sequence drafts
        eagerly from now on."""
        live = self.live()
        if lane in live:
            live.pop(lane).give_back()
        lanes = max(self.lanes, buckets.lanes_for(lane))
        columns = max(self.columns, buckets.static_columns(capacity))
        if (lanes, columns) != (self.lanes, self.columns):
            self._allocate(lanes, columns, live)
        one = slice(lane, lane + 1)
        cache = StaticCache([s[one] for s in self.keys], [s[one] for s in self.values], lane)
        self._borrowers[lane] = weakref.ref(cache)
        self._lent_at[lane] = next(self._clock)
        return cache


class Placed(NamedTuple):
    """A call that fits the step: its rows, its lane (the draft's and the target's), its
    draft cache's entries before them, and the target entries it reads (T)."""

    rows: GlideRows
    lane: int
    prefix: int
    committed: int


class GlideBuffers:
    """One shape's inputs and outputs, made once: ``lanes`` x ``size`` rows, lane by lane.
    ``columns``: the column each row writes in its lane; ``seen`` [lanes, size, columns]:
    the columns of its lane of the draft's storage each row sees; ``cross_seen`` [lanes,
    size, target columns] and ``cross_prefix`` [lanes]: of the target's lane, the columns
    the call's cross mask allows and the committed length below which they count;
    ``last`` [lanes]: each lane's last row, whose logits (per projection) come out."""

    def __init__(self, lanes: int, size: int, columns: int, target_columns: int, draft):
        weight = draft.norm.weight
        device, hidden = weight.device, draft.config.hidden_size
        self.lanes, self.size = lanes, size
        self.embeds = torch.zeros(lanes, size, hidden, dtype=weight.dtype, device=device)
        self.positions = torch.zeros(lanes, size, dtype=torch.long, device=device)
        self.columns = torch.zeros(lanes, size, dtype=torch.long, device=device)
        self.seen = torch.zeros(lanes, size, columns, dtype=torch.bool, device=device)
        self.cross_seen = torch.ones(lanes, size, target_columns, dtype=torch.bool, device=device)
        self.cross_prefix = torch.ones(lanes, dtype=torch.long, device=device)
        self.last = torch.zeros(lanes, dtype=torch.long, device=device)
        self.rows = torch.arange(size, device=device)
        self.lane_numbers = torch.arange(lanes, device=device)
        self.target_columns = torch.arange(target_columns, device=device)
        self.logits: dict[nn.Linear, torch.Tensor] = {}

    def tensors(self) -> list[torch.Tensor]:
        own = [v for v in vars(self).values() if isinstance(v, torch.Tensor)]
        return own + list(self.logits.values())

    def logits_for(self, linear: nn.Linear) -> torch.Tensor:
        if linear not in self.logits:
            shape = (self.lanes, linear.weight.shape[0])
            self.logits[linear] = self.embeds.new_zeros(shape, dtype=linear.weight.dtype)
        return self.logits[linear]

    def load_idle(self, scratch: int) -> None:
        """Every row padding: it writes its lane's scratch column and sees only that one
        of the draft's storage, and the target's first column (a row that saw no column
        at all would make NaNs, which the scratch column would pass on to real rows)."""
        self.columns.fill_(scratch)
        self.seen.fill_(False)
        self.seen[:, :, scratch] = True
        self.cross_seen.fill_(True)
        self.cross_prefix.fill_(1)
        self.last.fill_(0)

    def load(self, calls: list[Placed], scratch: int) -> None:
        """Each call's rows in its lane, writing at its prefix onward and seeing what its
        masks allow; every other row padding. Copies and fills on the device, no sync."""
        self.load_idle(scratch)
        for rows, lane, prefix, committed in calls:
            n = rows.positions.shape[0]
            self.embeds[lane, :n].copy_(rows.embeds)
            self.positions[lane, :n].copy_(rows.positions)
            torch.add(self.rows[:n], prefix, out=self.columns[lane, :n])
            self.last[lane] = n - 1
            seen = self.seen[lane, :n]
            seen.fill_(False)
            visible = visibility(rows.mask, prefix, n, seen.device)  # None: one row, sees all
            seen[:, : prefix + n] = True if visible is None else visible
            self.cross_prefix[lane] = committed
            if rows.cross_mask is not None:  # past ``committed``, cross_prefix hides them
                self.cross_seen[lane, :n, :committed] = rows.cross_mask


def _rotary_reads_host(draft: GlideDraft) -> bool:
    """Whether a rotary embedding of the draft recomputes its frequencies from the
    largest position (as ``engine.static.unsupported`` refuses for the target)."""
    for rotary in (draft.rotary, draft.cross_rotary):
        rope = getattr(rotary, "rope_type", "default")
        if "dynamic" in rope or rope == "longrope":
            return True
    return False


class GlideStep:
    """The fixed-shape step over a GLIDE draft's weights, the KV storage it lends, and the
    target step whose storage it reads (see the module's docstring). It records as the
    target's step does (``engine.capture``)."""

    def __init__(self, draft: GlideDraft, target: StaticStep):
        weight = draft.norm.weight
        self.draft, self.asked = draft, target.how
        self._target = weakref.ref(target)  # not kept alive by a draft that outlives it
        self.recorder = Recorder(weight.device, target.how)
        self.storage = TiedLanes(draft.config, len(draft.layers), weight.dtype, weight.device)
        self._versions = (0, 0)  # the storages', when the buffers and runs below were made
        self.buffers: dict[tuple[int, int], GlideBuffers] = {}
        # (lanes, bucket, projection) -> run its step once
        self._runs: dict[tuple[int, int, nn.Linear], Run] = {}
        self._projections: collections.OrderedDict[nn.Linear, None] = collections.OrderedDict()
        self.calls: collections.Counter[int] = collections.Counter()  # bucket -> runs
        self.batched: collections.Counter[int] = collections.Counter()  # lanes (> 1) -> runs

    @classmethod
    def of(cls, draft: GlideDraft, target: StaticStep) -> GlideStep | None:
        """The draft's step over ``target``'s storage, made once and kept on the draft
        (each decoding makes a new drafter; the recorded steps and the storage outlive
        it); None where a rotary embedding would read positions on the host."""
        if _rotary_reads_host(draft):
            return None
        found = kept(draft)
        if found is None or found.target is not target or found.asked != target.how:
            found = cls(draft, target)
            object.__setattr__(draft, "_autotune_step", found)  # not a submodule
        return found

    @property
    def target(self) -> StaticStep | None:
        return self._target()

    @property
    def failed(self) -> str | None:
        """Why recording failed (the drafter runs the eager draft from then on), or None."""
        return self.recorder.failed

    @property
    def scratch(self) -> int:
        return self.storage.columns - buckets.SCRATCH_COLUMNS

    def lend(self, capacity: int, lane: int) -> StaticCache:
        """Lane ``lane`` (its target cache's) of the storage as the draft's cache for one
        sequence (``TiedLanes.lend_lane``)."""
        return self.storage.lend_lane(capacity, lane)

    def place(self, calls: list[GlideRows]) -> list[Placed]:
        """The calls placed in the storages, or [] when they do not fit the step: each in
        its own lane, its draft cache lent here and its target cache by the target's step
        in the same lane, ``target_kv`` the first entries of that cache's layers the draft
        reads, every draft layer at one length, a bucket for its rows, room before the
        scratch columns, and masks over its rows' columns (None: causal, all the target)."""
        target, placed = self.target, list[Placed]()
        if target is None:
            return []
        for rows in calls:
            cache, n = rows.cache, rows.positions.shape[0]
            if not isinstance(cache, StaticCache) or not self.storage.holds(cache):
                return []
            if not isinstance(rows.target, StaticCache) or not target.storage.holds(rows.target):
                return []
            lane, prefix = cache.lane, cache.lengths[0]
            if rows.target.lane != lane or any(lane == other.lane for other in placed):
                return []
            committed = self._committed(rows, rows.target)
            if committed is None or any(length != prefix for length in cache.lengths):
                return []
            if not 1 <= n <= buckets.LARGEST or prefix + n > self.scratch:
                return []
            if rows.mask is not None and tuple(rows.mask.shape) not in ((n, n), (n, prefix + n)):
                return []
            if rows.cross_mask is not None and tuple(rows.cross_mask.shape) != (n, committed):
                return []
            placed.append(Placed(rows, lane, prefix, committed))
        return placed

    def _committed(self, rows: GlideRows, cache: StaticCache) -> int | None:
        """How many of the target cache's entries ``rows.target_kv`` holds (the same T in
        each draft layer's read, 1 <= T <= every read layer's length, each read starting
        at its layer's memory), or None where it is not such a read of ``cache``."""
        reads = rows.target_kv
        if len(reads) != len(self.draft.target_layers):
            return None
        counts = {keys.shape[-2] for keys, _ in reads}
        committed = counts.pop() if len(counts) == 1 else 0
        for (keys, values), layer in zip(reads, self.draft.target_layers):
            if not 1 <= committed <= cache.lengths[layer]:
                return None
            if (keys.data_ptr(), values.data_ptr()) != (
                cache.keys[layer].data_ptr(),
                cache.values[layer].data_ptr(),
            ):
                return None
        return committed

    def forward(
        self, calls: list[GlideRows], projection: DraftProjection
    ) -> list[torch.Tensor] | None:
        """Per call, the draft logits [V'] of its last row as the eager draft and
        ``projection`` give them, its keys and values appended to its draft cache; None
        when the calls do not fit the step (``place``) or it could not be recorded."""
        placed = self.place(calls) if self.failed is None else []
        if not placed:
            return None
        self._follow_storages()
        lanes = buckets.lanes_for(max(call.lane for call in placed))
        size = buckets.bucket_for(max(call.rows.positions.shape[0] for call in placed))
        assert size is not None  # place() checked each count against the largest bucket
        run = self._run(lanes, size, projection.linear)
        if run is None:  # the recording failed: said once, and the draft runs eagerly
            return None
        buffer = self.buffers[lanes, size]
        buffer.load(placed, self.scratch)
        run()
        self.calls[size] += 1
        if len(placed) > 1:
            self.batched[lanes] += 1
        for rows, _, prefix, _ in placed:
            rows.cache.lengths = [prefix + rows.positions.shape[0]] * len(rows.cache.lengths)
        # copies: the next run overwrites the buffer, the drafter keeps its distributions
        logits = buffer.logits[projection.linear]
        return [logits[call.lane].clone() for call in placed]

    def _follow_storages(self) -> None:
        """Drop the buffers and runs made over storage since replaced (the draft's grew,
        or the target's step lent a cache that needed more lanes or columns)."""
        target = self.target
        assert target is not None  # place() found it
        versions = (self.storage.version, target.storage.version)
        if versions != self._versions:
            self._versions = versions
            self.buffers.clear()
            self._runs.clear()
            self.recorder.forget()

    def _run(self, lanes: int, size: int, linear: nn.Linear) -> Run | None:
        """The step of this shape and projection, made (on CUDA: recorded) at its first call."""
        self._keep(linear)
        if (lanes, size, linear) in self._runs:
            return self._runs[lanes, size, linear]
        target = self.target
        assert target is not None  # place() found it
        if (lanes, size) not in self.buffers:
            columns = (self.storage.columns, target.storage.columns)
            self.buffers[lanes, size] = GlideBuffers(lanes, size, *columns, self.draft)
        buffer = self.buffers[lanes, size]
        step = functools.partial(self.compute, buffer, target, linear, buffer.logits_for(linear))
        buffer.load_idle(self.scratch)  # recording writes the scratch columns only
        what = f"the GLIDE draft's {size}-row step"
        what += f" over {lanes} sequences" if lanes > 1 else ""
        run = self.recorder.make(step, self._statics(buffer, target, linear), what)
        if run is not None:
            self._runs[lanes, size, linear] = run
        return run

    def _keep(self, linear: nn.Linear) -> None:
        """Mark a projection as the most recently used; past ``KEPT_VARIANTS`` (a study
        tries several draft vocabularies), the least recent one's runs and outputs go."""
        self._projections[linear] = None
        self._projections.move_to_end(linear)
        while len(self._projections) > KEPT_VARIANTS:
            dropped, _ = self._projections.popitem(last=False)
            self._runs = {key: run for key, run in self._runs.items() if key[2] is not dropped}
            for buffer in self.buffers.values():
                buffer.logits.pop(dropped, None)

    def compute(
        self, buffer: GlideBuffers, target: StaticStep, linear: nn.Linear, logits: torch.Tensor
    ) -> None:
        """The step itself, over the buffers and both storages: the eager draft's
        arithmetic (``GlideDraft.decoder_layers``) with every shape fixed, the lanes as
        the batch of both attentions, then each lane's last row through the projection's
        product into ``logits``."""
        draft, lanes, size = self.draft, buffer.lanes, buffer.size
        hidden = buffer.embeds
        own_mask = additive(buffer.seen, hidden.dtype)
        below = buffer.target_columns.view(1, 1, -1) < buffer.cross_prefix.view(lanes, 1, 1)
        cross_mask = additive(buffer.cross_seen & below, hidden.dtype)
        assert own_mask is not None and cross_mask is not None  # tensors in, tensors out
        writer = ColumnWriter(self.storage.keys, self.storage.values, buffer.columns)
        rope = draft.rotary(hidden, buffer.positions)
        own = [layers.AttentionSegment(size, rope, own_mask.unsqueeze(1), writer)]
        cross_rope = draft.cross_rotary(hidden, buffer.positions)
        stored, seen = target.storage, cross_mask.unsqueeze(1)
        cross = [  # per draft layer, its target layer's lanes as they lie (views)
            [CrossSegment(size, cross_rope, stored.keys[t][:lanes], stored.values[t][:lanes], seen)]
            for t in draft.target_layers
        ]
        normed = draft.decoder_layers(hidden, own, cross)  # [lanes, size, H]
        last = normed[buffer.lane_numbers, buffer.last]  # [lanes, H]: indices on the device
        logits.copy_(layers.linear(last, linear))  # as ``DraftProjection`` multiplies

    def _statics(
        self, buffer: GlideBuffers, target: StaticStep, linear: nn.Linear
    ) -> list[torch.Tensor]:
        """Every tensor the step reads or writes besides the draft's parameters: its own
        storage, the target layers' storage it reads, the buffers, and the projection's
        weight (the target's lm_head, or a draft vocabulary's rows: not the draft's)."""
        read = [target.storage.keys[t] for t in self.draft.target_layers]
        read += [target.storage.values[t] for t in self.draft.target_layers]
        own = [*self.storage.keys, *self.storage.values]
        return [*own, *read, *buffer.tensors(), linear.weight]


def kept(draft: GlideDraft) -> GlideStep | None:
    """The step kept on the draft (``GlideStep.of``), or None."""
    found = getattr(draft, "_autotune_step", None)
    return found if isinstance(found, GlideStep) else None
