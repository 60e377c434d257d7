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

import functools
from typing import NamedTuple

import torch
from torch import nn

from autotune.engine import buckets, layers
from autotune.engine.runner import additive
from autotune.engine.static import ColumnWriter
from autotune.engine.static_cache import LaneStorage, StaticCache
from autotune.heads.eagle import CommitRows, DraftProjection, EagleHead, HeadRows
from autotune.heads.head_step import HeadBuffers, HeadStep

# One call's outputs per sequence: predicted features [S, H], their draft logits [S, V']
Outputs = tuple[torch.Tensor, torch.Tensor]


class HeadInputs(NamedTuple):
    """One call's rows as a step holds them, [lanes, size, ...] each: the pairs' features
    and token embeddings, their positions, and the columns of its lane each row sees."""

    features: torch.Tensor
    embeds: torch.Tensor
    positions: torch.Tensor
    seen: torch.Tensor


def head_rows(
    head: EagleHead, storage: LaneStorage, rows: HeadInputs, columns: torch.Tensor
) -> torch.Tensor:
    """The predicted features [lanes, size, H] of ``rows``: the eager head's arithmetic
    (``EagleHead.pairs`` and ``decoder_layers``) with every shape fixed, the lanes as the
    batch of attention, each row's keys and values written at its column (``columns``
    [lanes, size]) of its lane of ``storage``. No value is read back to the host."""
    hidden = head.pairs(rows.features, rows.embeds)
    rotation = layers.Rotation(head.rotary(hidden, rows.positions))
    mask = additive(rows.seen, hidden.dtype)
    assert mask is not None  # a tensor in, a tensor out
    writer = ColumnWriter(storage.keys, storage.values, columns)
    segment = layers.AttentionSegment(hidden.shape[1], rotation, mask.unsqueeze(1), writer)
    return head.decoder_layers(hidden, [segment])


class Placed(NamedTuple):
    """A call that fits the step: its rows, its cache's lane, its cached entries before them."""

    rows: HeadRows | CommitRows
    lane: int
    prefix: int


class Variant(NamedTuple):
    """What a run of the step is recorded for: the draft projection (its weight's module)
    and, for commits (``CommitRows``), the target's final norm and embedding, which the
    step applies to the hidden states and tokens it is given."""

    linear: nn.Linear
    norm: nn.Module | None = None
    embed: nn.Module | None = None

    @staticmethod
    def of(calls: list[HeadRows | CommitRows], linear: nn.Linear) -> Variant | None:
        """The calls' variant, or None where they mix kinds or targets."""
        first = calls[0]
        if all(isinstance(call, HeadRows) for call in calls):
            return Variant(linear)
        if isinstance(first, CommitRows) and all(
            isinstance(call, CommitRows) and (call.norm, call.embed) == (first.norm, first.embed)
            for call in calls
        ):
            return Variant(linear, first.norm, first.embed)
        return None


class EagleBuffers(HeadBuffers):
    """One shape's buffers (``HeadBuffers``) with the pairs' features and embeddings in
    (a commit's: the target's hidden states in ``features`` and its tokens in ``tokens``,
    a host input), and the predicted features and every row's draft logits out."""

    def __init__(self, lanes: int, size: int, columns: int, head: EagleHead):
        weight = head.fc.weight
        fields: dict[str, tuple[tuple[int, ...], torch.dtype]] = {
            "tokens": ((lanes, size), torch.long)
        }
        super().__init__(lanes, size, columns, weight, logit_rows=lanes * size, fields=fields)
        self.tokens = self.inputs.device["tokens"]
        shape = (lanes, size, head.hidden_size)
        self.features = torch.zeros(shape, dtype=weight.dtype, device=weight.device)
        self.embeds = torch.zeros_like(self.features)
        self.predicted = self.features.new_zeros(lanes * size, head.hidden_size)

    def load(self, calls: list[Placed], scratch: int) -> None:
        """Each call's rows in its lane; every other row padding. No sync."""
        self.idle(scratch)
        for rows, lane, prefix in calls:
            n = rows.positions.shape[0]
            if isinstance(rows, CommitRows):
                self.features[lane, :n].copy_(rows.hidden)
                self.inputs.put("tokens", (lane, slice(n)), rows.tokens)
            else:
                self.features[lane, :n].copy_(rows.features)
                self.embeds[lane, :n].copy_(rows.embeds)
            self.load_rows(lane, rows.positions, prefix, rows.mask)
        self.inputs.send()


class EagleStep(HeadStep):
    """The fixed-shape step over an EAGLE head's weights and the KV storage it lends (see
    the module's docstring). ``how``: as the target's step records (``engine.capture``)."""

    title = "the EAGLE head"

    def __init__(self, head: EagleHead, how: str = "graph"):
        weight = head.fc.weight
        storage = LaneStorage(head.config, len(head.layers), weight.dtype, weight.device)
        super().__init__(weight.device, how, storage)
        self.head, self.asked = head, how

    @classmethod
    def of(cls, head: EagleHead, how: str = "graph") -> EagleStep:
        """The head's step, made once and kept on the head: each decoding makes a new
        drafter, and the recorded steps and the storage outlive it."""
        found = getattr(head, "_autotune_step", None)
        if not isinstance(found, cls) or found.asked != how:
            found = cls(head, how)
            object.__setattr__(head, "_autotune_step", found)  # not a submodule
        return found

    def lend(self, capacity: int) -> StaticCache:
        """A lane of the storage as the head's cache for one sequence
        (``LaneStorage.lend``); storage that grows drops what was made over the old one."""
        cache = self.storage.lend(capacity)
        self.follow(self.storage.version)
        return cache

    def place(self, calls: list[HeadRows | CommitRows]) -> list[Placed]:
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

    def forward(
        self, calls: list[HeadRows | CommitRows], projection: DraftProjection
    ) -> list[Outputs] | None:
        """Per call, (predicted features [S, H], draft logits [S, V']) as the eager head
        and ``projection`` give them (views of the step's buffers, valid until its next
        run), its keys and values appended to its cache; None when the calls do not fit
        the step (``place``: commits and other rows are not run together) or it could
        not be recorded."""
        variant = Variant.of(calls, projection.linear)
        placed = self.place(calls) if self.failed is None and variant is not None else []
        if not placed:
            return None
        buffer = self.replay(placed, variant)
        if buffer is None:  # the recording failed: said once, and the head runs eagerly
            return None
        size = buffer.size
        logits, outputs = buffer.logits[variant], []
        for rows, lane, prefix in placed:
            n = rows.positions.shape[0]
            rows.cache.lengths = [prefix + n] * len(rows.cache.lengths)
            first = lane * size
            # views, valid until the step's next run overwrites them: a drafter takes what
            # it keeps from them (top-k, gathers, the next call's copy-in) before its next
            # call, queued ahead of that run on the device; copies would be two launches more
            outputs.append((buffer.predicted[first : first + n], logits[first : first + n]))
        return outputs

    def new_buffers(self, lanes: int, size: int) -> EagleBuffers:
        return EagleBuffers(lanes, size, self.storage.columns, self.head)

    def step(self, buffer: EagleBuffers, variant: Variant) -> functools.partial:
        logits = buffer.logits_for(variant, variant.linear)
        return functools.partial(self.compute, buffer, variant, logits)

    def compute(self, buffer: EagleBuffers, variant: Variant, logits: torch.Tensor) -> None:
        """The step itself, over the buffers and the storage (``head_rows``), then the
        draft projection's product into ``logits``. A commit's pairs are made here: the
        target's final norm over its hidden states, its embedding of the tokens."""
        features, embeds = buffer.features, buffer.embeds
        if variant.norm is not None and variant.embed is not None:
            features, embeds = variant.norm(features), variant.embed(buffer.tokens)
        rows = HeadInputs(features, embeds, buffer.positions, buffer.seen)
        predicted = head_rows(self.head, self.storage, rows, buffer.columns)
        predicted = predicted.view(buffer.lanes * buffer.size, -1)
        buffer.predicted.copy_(predicted)
        logits.copy_(layers.linear(predicted, variant.linear))  # as ``DraftProjection`` does

    def statics(self, buffer: EagleBuffers, variant: Variant) -> list[torch.Tensor]:
        """Every tensor the step reads or writes besides the head's parameters: the
        storage, the buffers, the projection's weight (the target's lm_head, or a draft
        vocabulary's rows of it: not the head's), and a commit's norm and embedding."""
        storage = [*self.storage.keys, *self.storage.values]
        target = [
            weight
            for module in (variant.norm, variant.embed)
            if module is not None
            for weight in module.parameters()
        ]
        return [*storage, *buffer.tensors(), variant.linear.weight, *target]
