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
allows. A sequence's draft cache is lent the lane its target cache holds,
so one lane number indexes both storages and the cross-attention takes a view of the
target's lanes: no lane map to gather a copy of the target's keys by, every step. The
recorded runs read both storages' memory, so they are dropped when either is replaced.

The exit rule (the chain stops where the draft's top probability falls below a
threshold) reads that probability on the host between steps, so it stays eager.
"""

from __future__ import annotations

import functools
import weakref
from typing import NamedTuple

import numpy as np
import torch
from torch import nn

from autotune.engine import buckets, layers
from autotune.engine.runner import additive
from autotune.engine.static import ColumnWriter, StaticStep, host_rotary
from autotune.engine.static_cache import LaneStorage, StaticCache
from autotune.heads.eagle import DraftProjection
from autotune.heads.glide import CrossSegment, GlideDraft, GlideRows
from autotune.heads.head_step import HeadBuffers, HeadStep


class DraftInputs(NamedTuple):
    """One call's rows as a step holds them, [lanes, size, ...] each: their input
    embeddings and positions, the columns of their lane of the draft's storage each row
    sees, and the columns of the target's lane each row's cross-attention reads."""

    embeds: torch.Tensor
    positions: torch.Tensor
    seen: torch.Tensor
    cross_seen: torch.Tensor


def draft_rows(
    draft: GlideDraft, storage: LaneStorage, target: StaticStep, rows: DraftInputs, columns
) -> torch.Tensor:
    """The final-normed outputs [lanes, size, H] of ``rows``: the eager draft's arithmetic
    (``GlideDraft.decoder_layers``) with every shape fixed, the lanes as the batch of both
    attentions, each row's keys and values written at its column (``columns`` [lanes,
    size]) of its lane of ``storage``, each cross-attention reading its target layer's
    lanes of ``target``'s storage as they lie. No value is read back to the host."""
    hidden, lanes, size = rows.embeds, rows.embeds.shape[0], rows.embeds.shape[1]
    own_mask = additive(rows.seen, hidden.dtype)
    cross_mask = additive(rows.cross_seen, hidden.dtype)
    assert own_mask is not None and cross_mask is not None  # tensors in, tensors out
    writer = ColumnWriter(storage.keys, storage.values, columns)
    rope = draft.rotary(hidden, rows.positions)
    own = [layers.AttentionSegment(size, rope, own_mask.unsqueeze(1), writer)]
    cross_rope = draft.cross_rotary(hidden, rows.positions)
    stored, seen = target.storage, cross_mask.unsqueeze(1)
    cross = [  # per draft layer, its target layer's lanes as they lie (views)
        [CrossSegment(size, cross_rope, stored.keys[t][:lanes], stored.values[t][:lanes], seen)]
        for t in draft.target_layers
    ]
    return draft.decoder_layers(hidden, own, cross)


class Placed(NamedTuple):
    """A call that fits the step: its rows, its lane (the draft's and the target's), its
    draft cache's entries before them, and the target entries it reads (T)."""

    rows: GlideRows
    lane: int
    prefix: int
    committed: int


class GlideBuffers(HeadBuffers):
    """One shape's buffers (``HeadBuffers``) with the rows' embeddings in and each lane's
    last row's draft logits out; ``cross_seen`` [lanes, size, target columns] and
    ``cross_prefix`` [lanes]: of the target's lane, the columns the call's cross mask
    allows and the committed length below which they count; ``last`` [lanes]: each
    lane's last row."""

    def __init__(self, lanes: int, size: int, columns: int, target_columns: int, draft):
        weight = draft.norm.weight
        fields = {
            "cross_seen": ((lanes, size, target_columns), torch.bool),
            "cross_prefix": ((lanes,), torch.long),
            "last": ((lanes,), torch.long),
        }
        super().__init__(lanes, size, columns, weight, logit_rows=lanes, fields=fields)
        device, hidden = weight.device, draft.config.hidden_size
        self.embeds = torch.zeros(lanes, size, hidden, dtype=weight.dtype, device=device)
        views = self.inputs.device
        self.cross_seen, self.cross_prefix = views["cross_seen"], views["cross_prefix"]
        self.last = views["last"]
        self.lane_numbers = torch.arange(lanes, device=device)
        self.target_columns = torch.arange(target_columns, device=device)

    def idle(self, scratch: int) -> dict[str, np.ndarray]:
        """Every row padding (``HeadBuffers.idle``), seeing the target's first column (a
        row that saw no column at all would make NaNs, which the scratch column would
        pass on to real rows)."""
        host = super().idle(scratch)
        host["cross_seen"].fill(True)
        host["cross_prefix"].fill(1)
        host["last"].fill(0)
        return host

    def load(self, calls: list[Placed], scratch: int) -> None:
        """Each call's rows in its lane, seeing what its masks allow; every other row
        padding. Written on the host and sent in one copy; no sync."""
        host = self.idle(scratch)
        for rows, lane, prefix, committed in calls:
            n = rows.positions.shape[0]
            self.embeds[lane, :n].copy_(rows.embeds)
            self.load_rows(lane, rows.positions, prefix, rows.mask)
            host["last"][lane] = n - 1
            host["cross_prefix"][lane] = committed
            if rows.cross_mask is not None:  # past ``committed``, cross_prefix hides them
                self.inputs.put("cross_seen", (lane, slice(n), slice(committed)), rows.cross_mask)
        self.inputs.send()


class GlideStep(HeadStep):
    """The fixed-shape step over a GLIDE draft's weights, the KV storage it lends, and the
    target step whose storage it reads (see the module's docstring). It records as the
    target's step does (``engine.capture``)."""

    title = "the GLIDE draft"

    def __init__(self, draft: GlideDraft, target: StaticStep):
        weight = draft.norm.weight
        storage = LaneStorage(draft.config, len(draft.layers), weight.dtype, weight.device)
        super().__init__(weight.device, target.how, storage)
        self.draft, self.asked = draft, target.how
        self._target = weakref.ref(target)  # not kept alive by a draft that outlives it

    @classmethod
    def of(cls, draft: GlideDraft, target: StaticStep) -> GlideStep | None:
        """The draft's step over ``target``'s storage, made once and kept on the draft
        (each decoding makes a new drafter; the recorded steps and the storage outlive
        it); None where a rotary embedding would read positions on the host."""
        if any(host_rotary(rotary) for rotary in (draft.rotary, draft.cross_rotary)):
            return None
        found = kept(draft)
        if found is None or found.target is not target or found.asked != target.how:
            found = cls(draft, target)
            object.__setattr__(draft, "_autotune_step", found)  # not a submodule
        return found

    @property
    def target(self) -> StaticStep | None:
        return self._target()

    def lend(self, capacity: int, lane: int) -> StaticCache:
        """Lane ``lane`` (its target cache's) of the storage as the draft's cache for one
        sequence (``LaneStorage.lend``)."""
        return self.storage.lend(capacity, lane)

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
        ``projection`` give them (views, valid until the step's next run), its keys and
        values appended to its draft cache; None when the calls do not fit the step
        (``place``) or it could not be recorded."""
        placed = self.place(calls) if self.failed is None else []
        if not placed:
            return None
        self._follow_storages()
        buffer = self.replay(placed, projection.linear)
        if buffer is None:  # the recording failed: said once, and the draft runs eagerly
            return None
        for rows, _, prefix, _ in placed:
            rows.cache.lengths = [prefix + rows.positions.shape[0]] * len(rows.cache.lengths)
        # views, valid until the step's next run (see ``EagleStep.forward``): the drafter
        # makes its distributions from them before its next call
        logits = buffer.logits[projection.linear]
        return [logits[call.lane] for call in placed]

    def _follow_storages(self) -> None:
        """Drop the buffers and runs made over storage since replaced (the draft's grew,
        or the target's step lent a cache that needed more lanes or columns)."""
        target = self.target
        assert target is not None  # place() found it
        self.follow((self.storage.version, target.storage.version))

    def new_buffers(self, lanes: int, size: int) -> GlideBuffers:
        target = self.target
        assert target is not None  # place() found it
        columns = (self.storage.columns, target.storage.columns)
        return GlideBuffers(lanes, size, *columns, self.draft)

    def step(self, buffer: GlideBuffers, linear: nn.Linear) -> functools.partial:
        target = self.target
        assert target is not None  # place() found it
        return functools.partial(
            self.compute, buffer, target, linear, buffer.logits_for(linear, linear)
        )

    def compute(
        self, buffer: GlideBuffers, target: StaticStep, linear: nn.Linear, logits: torch.Tensor
    ) -> None:
        """The step itself, over the buffers and both storages (``draft_rows``), then
        each lane's last row through the projection's product into ``logits``."""
        lanes = buffer.lanes
        below = buffer.target_columns.view(1, 1, -1) < buffer.cross_prefix.view(lanes, 1, 1)
        rows = DraftInputs(buffer.embeds, buffer.positions, buffer.seen, buffer.cross_seen & below)
        normed = draft_rows(self.draft, self.storage, target, rows, buffer.columns)
        last = normed[buffer.lane_numbers, buffer.last]  # [lanes, H]: indices on the device
        logits.copy_(layers.linear(last, linear))  # as ``DraftProjection`` multiplies

    def statics(self, buffer: GlideBuffers, linear: nn.Linear) -> list[torch.Tensor]:
        """Every tensor the step reads or writes besides the draft's parameters: its own
        storage, the target layers' storage it reads, the buffers, and the projection's
        weight (the target's lm_head, or a draft vocabulary's rows: not the draft's)."""
        target = self.target
        assert target is not None  # place() found it
        read = [target.storage.keys[t] for t in self.draft.target_layers]
        read += [target.storage.values[t] for t in self.draft.target_layers]
        own = [*self.storage.keys, *self.storage.values]
        return [*own, *read, *buffer.tensors(), linear.weight]


def kept(draft: GlideDraft) -> GlideStep | None:
    """The step kept on the draft (``GlideStep.of``), or None."""
    found = getattr(draft, "_autotune_step", None)
    return found if isinstance(found, GlideStep) else None
