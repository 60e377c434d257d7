"""The runner's fixed-shape step, which a GPU records once and replays.

Eager on a GPU, a step is launch overhead: Vicuna-13B in float16 took 17.7 ms a token on
an H200 where a CUDA-graph forward of the same model took 9.1. A graph replays fixed
kernels on fixed memory, so this step has one shape per bucket (``engine.buckets``):
its inputs are copied into buffers made once, every row writes its keys and values into
KV storage allocated once (``engine.static_cache``: a scatter at its column, the padded
rows at a scratch column), attention reads the whole storage under a visibility mask
made on the device from the prefix lengths and the new tokens' mask, and the logits
land in an output buffer. Nothing in it reads a value back to the host.

The storage holds several sequences side by side, one per lane, so that a batched
forward (several sequences in flight, ``engine.batched``) runs as one step too: its rows
are laid out lane by lane, each lane's ``size`` rows (the bucket of the call's longest
segment), and attention runs as a batch over the lanes. ``StaticStep.lend`` gives each
sequence a lane as a ``StaticCache``; ``forward`` runs a call that fits the step (the
runner falls back to its eager layers for the others). A call may leave sublayers out
(a layer-skip draft) or ask for extra logits rows (Medusa's heads over the verify
forward's lm_head product): each such ``Variant`` is a step of its own per bucket, and
the few most recently used are kept. ``how`` says how the step runs on CUDA
(``engine.capture``): ``graph`` (one ``torch.cuda.CUDAGraph`` per shape and variant),
``compile`` (``torch.compile(mode="reduce-overhead")`` of the same step, so that the two
can be timed against each other) or ``eager``; elsewhere it always runs eagerly, which
is what the CPU tests check against the runner's own layers.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from autotune.engine import buckets, layers
from autotune.engine.capture import HOWS, SWITCH_ENV
from autotune.engine.layers import Fused, Product
from autotune.engine.recorded import KEPT_VARIANTS, RecordedSteps
from autotune.engine.segment import Segment
from autotune.engine.skip import NO_SKIP, SkipMask
from autotune.engine.staging import FedTokens, HostInputs
from autotune.engine.static_cache import LaneStorage, StaticCache

__all__ = [
    "KEPT_VARIANTS",
    "StaticCache",
    "StaticStep",
    "Variant",
    "enabled_by_default",
    "host_rotary",
    "unsupported",
]

# One call's outputs per segment: logits, hidden states, extra rows' logits (or None)
Outputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]


# A prompt longer than the largest bucket is prefilled in parts of that bucket only for
# models of at most this many bytes of weights. Each part reads every weight again: an
# estimate from the cards' bandwidth (3.35 TB/s on an H100) makes 2 GiB 0.6 ms a part,
# under the ~1 ms of launches a small model's replay holds, where its eager prefill is
# mostly launches; a 13B model's 26 GB is 7.8 ms a part, and its prefill in one eager
# call reads them once. Not yet measured on a GPU (the check's greedy step will time it).
PARTS_WEIGHT_BYTES = 2 << 30


@dataclass(frozen=True)
class Variant:
    """What a call computes besides the plain forward: per layer, whether its attention
    and its MLP run (False: skipped, the residual passes through), and the callable that
    makes extra rows for the lm_head (``Runner.forward``'s ``extra_rows``; hashable, and
    equal from one decoding to the next, so that its steps are made once)."""

    attends: tuple[bool, ...]
    mlps: tuple[bool, ...]
    extra_rows: Callable[[torch.Tensor], torch.Tensor] | None = None
    # after a one-token step, each lane's argmax is fed to its next run (``decode_fed``)
    feeds: bool = False

    @classmethod
    def of(
        cls, layers: int, skip: SkipMask = NO_SKIP, extra_rows=None, feeds: bool = False
    ) -> Variant:
        # tuples of bools rather than the mask's sets: constants torch.compile reads plainly
        return cls(
            tuple(i not in skip.attention for i in range(layers)),
            tuple(i not in skip.mlp for i in range(layers)),
            extra_rows,
            feeds,
        )

    # read at every call of the step: worked out once per variant (a variant is made once
    # per skip mask and extra rows, ``StaticStep.variant``), not once per call
    @functools.cached_property
    def plain(self) -> bool:
        return all(self.attends) and all(self.mlps) and self.extra_rows is None

    @functools.cached_property
    def attending(self) -> tuple[int, ...]:
        """The layers whose attention runs (and writes the cache)."""
        return tuple(i for i, runs in enumerate(self.attends) if runs)


class StepModel(Protocol):
    """What the step reads of a runner (``engine.runner.Runner``)."""

    config: Any
    embed: Any
    rotary: Any
    norm: Any
    layers: list[Any]
    fused: list[tuple[Fused, Fused]]
    num_layers: int
    device: torch.device
    dtype: torch.dtype
    product: Product

    def logits(self, normed: torch.Tensor) -> torch.Tensor: ...


class StepBuffers:
    """One shape's inputs and outputs, made once; a replay reads and writes only these
    and the cache storage. Rows lie lane by lane, ``size`` a lane. ``columns``: the
    column each row writes in its lane; ``new_mask`` [lanes, size, size]: which of its
    lane's new tokens each row sees (True = may attend); ``prefix`` [lanes]: each lane's
    cached entries before them. The inputs are written on the host and sent in one copy
    (``engine.staging``)."""

    def __init__(self, lanes: int, size: int, model: StepModel, columns: int):
        device, hidden = model.device, model.config.hidden_size
        self.lanes, self.size = lanes, size
        self.column_numbers = torch.arange(columns, device=device)  # of a lane
        rows = (lanes, size)
        self.inputs = HostInputs(
            {
                "tokens": (rows, torch.long),
                "positions": (rows, torch.long),
                "columns": (rows, torch.long),
                "prefix": ((lanes,), torch.long),
                "new_mask": ((lanes, size, size), torch.bool),
                "active": ((lanes,), torch.long),  # 1: a lane in the call, 0: padding
                "fed": ((1,), torch.long),  # the runs fed so far (``feed``)
            },
            device,
        )
        views = self.inputs.device
        self.tokens, self.positions, self.columns = (
            views[name] for name in ("tokens", "positions", "columns")
        )
        self.prefix, self.new_mask = views["prefix"], views["new_mask"]
        self.active, self.fed = views["active"], views["fed"]
        # each lane's tokens fed from one run to the next, in the order they were made
        self.history = torch.zeros(lanes, columns, dtype=torch.long, device=device)
        self.causal = np.tri(size, dtype=np.bool_)
        self.hidden = torch.zeros(lanes * size, hidden, dtype=model.dtype, device=device)
        self.logits = torch.zeros(lanes * size, model.config.vocab_size, device=device)
        # a variant's extra logits rows, made at its first (eager) run, before any capture
        self.extra_logits: dict[Variant, torch.Tensor] = {}

    def tensors(self) -> list[torch.Tensor]:
        return [v for v in vars(self).values() if isinstance(v, torch.Tensor)] + list(
            self.extra_logits.values()
        )

    def drop(self, variant: Variant) -> None:
        self.extra_logits.pop(variant, None)

    def load(self, segments: list[Segment], prefixes: list[int], scratch: int) -> None:
        """The call's tokens, positions and masks in their lanes, each segment's rows
        writing at its prefix onward and every other row at ``scratch``: written on the
        host and sent in one copy; a segment's values already on the device are copied
        there after it. Nothing is read back to the host."""
        host, put = self._idle(scratch), self.inputs.put
        for segment, prefix in zip(segments, prefixes):
            lane, n = segment.cache.lane, len(segment.tokens)  # type: ignore[attr-defined]
            put("tokens", (lane, slice(n)), segment.tokens)
            put("positions", (lane, slice(n)), segment.positions)
            host["prefix"][lane] = prefix
            host["active"][lane] = 1
            host["columns"][lane, :n] = np.arange(prefix, prefix + n)
            seen = host["new_mask"][lane]
            seen[:n] = False
            if segment.mask is None:
                seen[:n, :n] = self.causal[:n, :n]
            else:
                put("new_mask", (lane, slice(n), slice(n)), segment.mask)
            # every padded row maps to the scratch column with the same mask column
            # (real rows: no, padded rows: yes), so the scatter in ``visibility`` agrees
            seen[n:, :n] = False
        self.inputs.send()

    def load_idle(self, scratch: int) -> None:
        """Inputs whose every row is padding: a run writes the scratch columns only (the
        warm-up and capture runs, while sequences' entries sit in the cache)."""
        self._idle(scratch)
        self.inputs.send()

    def _idle(self, scratch: int) -> dict[str, np.ndarray]:
        """The host inputs set to every row padding, not yet sent."""
        host = self.inputs.writable()
        host["prefix"].fill(0)
        host["columns"].fill(scratch)
        host["new_mask"].fill(True)
        host["active"].fill(0)
        host["fed"].fill(0)
        return host

    def feed(self) -> None:
        """After a one-token step, on the device: each lane's argmax (as ``int(argmax)``
        of its logits picks it, the first of equal values) kept in ``history`` at the runs
        fed so far, and made the lane's next input one position on; a lane in the call
        also writes one column on and sees one more entry, a padded lane stays at the
        scratch column."""
        token = self.logits.argmax(dim=-1, keepdim=True)  # [lanes, 1]: one row a lane
        self.history.index_copy_(1, self.fed, token)
        self.tokens.copy_(token)
        self.positions.add_(1)
        self.columns.add_(self.active.view(-1, 1))
        self.prefix.add_(self.active)
        self.fed.add_(1)


class ColumnWriter:
    """The cache as ``layers.segmented_attention`` uses it (``update``): each row's keys
    and values [lanes, kv_heads, size, D] go to its column of its lane, and attention
    reads every column of the lanes in the step."""

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor], columns):
        self.keys, self.values, self.columns = keys, values, columns

    def update(self, key: torch.Tensor, value: torch.Tensor, layer: int):
        lanes, heads, size, dim = key.shape
        index = self.columns.view(lanes, 1, size, 1).expand(lanes, heads, size, dim)
        keys, values = self.keys[layer][:lanes], self.values[layer][:lanes]
        keys.scatter_(2, index, key)
        values.scatter_(2, index, value)
        return keys, values


def enabled_by_default(device: torch.device) -> bool:
    """On a GPU, unless ``AUTOTUNE_STATIC=0``; on a CPU only with ``AUTOTUNE_STATIC=1``
    (eager there: it runs the GPU's code path end to end where no GPU is at hand), so
    that the CPU path stays as it was."""
    switch = os.environ.get(SWITCH_ENV, "")
    return switch == "1" or (device.type == "cuda" and switch != "0")


def unsupported(model: StepModel, how: str) -> str | None:
    """Why the step cannot run this runner's model, or None when it can."""
    if how not in HOWS:
        raise ValueError(f"how must be one of {', '.join(HOWS)}, not {how!r}")
    return host_rotary(model.rotary)


def host_rotary(rotary: Any) -> str | None:
    """Why a rotary embedding cannot run in a fixed-shape step, or None when it can."""
    rope = getattr(rotary, "rope_type", "default")
    if "dynamic" in rope or rope == "longrope":
        # these recompute their frequencies from the largest position: a host sync
        return f"rotary embedding {rope!r} reads the positions on the host"
    return None


class StaticStep(RecordedSteps):
    """The fixed-shape step over a runner's weights, one shape (lanes, bucket) and
    variant at a time, and the KV storage it lends (see the module's docstring)."""

    title = "the engine"

    def __init__(self, model: StepModel, how: str = "graph"):
        storage = LaneStorage(model.config, model.num_layers, model.dtype, model.device)
        super().__init__(model.device, how, storage)
        self.model = model
        self._variant_of: dict[tuple[SkipMask, Any, bool], Variant] = {}
        weights = [p for m in (model.embed, *model.layers) for p in m.parameters()]
        self.parts_pay = sum(p.numel() * p.element_size() for p in weights) <= PARTS_WEIGHT_BYTES

    @classmethod
    def of(cls, model: StepModel, how: str = "graph") -> StaticStep | None:
        return None if unsupported(model, how) else cls(model, how)

    @property
    def columns(self) -> int:
        """Each lane's columns, the scratch column last (0 before any is lent)."""
        return self.storage.columns

    @property
    def keys(self) -> list[torch.Tensor]:
        return self.storage.keys

    @property
    def values(self) -> list[torch.Tensor]:
        return self.storage.values

    def lend(self, capacity: int) -> StaticCache:
        """A lane of the storage as an empty cache for ``capacity`` tokens, for one
        sequence (``LaneStorage.lend``); storage that grows drops the steps recorded
        over the old one."""
        cache = self.storage.lend(capacity)
        self.follow(self.storage.version)
        return cache

    def variant(self, skip: SkipMask = NO_SKIP, extra_rows=None, feeds: bool = False) -> Variant:
        key = (skip, extra_rows, feeds)
        if key not in self._variant_of:  # made once: every decode step asks
            if len(self._variant_of) >= 64:  # a search's masks: it need not hold them all
                self._variant_of.clear()
            self._variant_of[key] = Variant.of(self.model.num_layers, skip, extra_rows, feeds)
        return self._variant_of[key]

    def fits(self, segments: list[Segment], variant: Variant | None = None) -> bool:
        """Whether ``forward`` can run this call: each segment in its own lane of this
        storage, the layers whose attention runs at one length (a skipped layer's may
        lag: a draft leaves it unwritten), a bucket for its tokens, room before the
        scratch column, and a mask over its new tokens only (None: causal)."""
        return self.failed is None and self._prefixes(segments, variant or self.variant()) != []

    def _prefixes(self, segments: list[Segment], variant: Variant) -> list[int]:
        """Each segment's cached entries before its tokens, or [] when the call does not fit."""
        prefixes, lanes = [], set()
        for segment in segments:
            cache, n, mask = segment.cache, len(segment.tokens), segment.mask
            if not isinstance(cache, StaticCache) or not self.storage.holds(cache):
                return []
            lengths = {length for length, runs in zip(cache.lengths, variant.attends) if runs}
            if len(lengths) != 1 or cache.lane in lanes:  # no attention, or lagging layers
                return []
            prefix = lengths.pop()
            if not 1 <= n <= buckets.LARGEST or prefix + n > self.scratch:
                return []
            if mask is not None and tuple(mask.shape) != (n, n):
                return []
            prefixes.append(prefix)
            lanes.add(cache.lane)
        return prefixes

    def forward(
        self, segments: list[Segment], skip: SkipMask = NO_SKIP, extra_rows=None
    ) -> list[Outputs] | None:
        """Per segment: logits [n, V] float32 (or [1, V] for ``last_only``), hidden [n, H]
        and the extra rows' logits (or None), its keys and values appended to its cache
        in the layers whose attention runs, as ``Runner.forward_batch`` returns them;
        None when the call does not fit (``fits``). One causal sequence longer than the
        largest bucket (a long prompt's prefill) runs in parts (``_in_parts``)."""
        if len(segments) == 1 and len(segments[0].tokens) > buckets.LARGEST:
            return self._in_parts(segments[0], skip, extra_rows) if self.parts_pay else None
        variant = self.variant(skip, extra_rows)
        prefixes = self._prefixes(segments, variant) if self.failed is None else []
        if not prefixes:
            return None
        size = buckets.bucket_for(max(len(s.tokens) for s in segments))
        lanes = buckets.lanes_for(max(s.cache.lane for s in segments))  # type: ignore[attr-defined]
        assert size is not None  # _prefixes checked every count against the largest bucket
        run = self.run_for(lanes, size, variant)
        if run is None:  # the capture failed: said once, and the runner runs eagerly
            return None
        buffer = self.buffers[lanes, size]
        buffer.load(segments, prefixes, self.scratch)
        run()
        self.ran(size, len(segments))
        return [
            self._outputs(buffer, variant, segment, prefix)
            for segment, prefix in zip(segments, prefixes)
        ]

    @torch.inference_mode()  # as a forward runs
    def decode_fed(
        self, cache: StaticCache, token: int, position: int, count: int, stop: Callable[[int], bool]
    ) -> list[int] | None:
        """Plain greedy decoding's next tokens after ``token`` (at ``position``, the end of
        ``cache``): ``count`` of them, or up to the first that ``stop`` says ends it. Each
        one-token step's argmax is its next run's input on the device (``Variant.feeds``),
        so the host queues the next run before it reads a token: on a GPU it never waits
        for a step with none queued behind it (a decode step there was 2.41 ms, of it
        0.24 ms around the replay, mostly that wait). The run after a stopping token is
        queued too, and waited for: its entry lies past the cache's length. None where
        the call does not fit the step."""
        variant = self.variant(feeds=True)
        segment = Segment(torch.tensor([token]), torch.tensor([position]), cache)
        prefixes = self._prefixes([segment], variant) if self.failed is None else []
        if not prefixes or count < 1 or prefixes[0] + count > self.scratch:
            return None
        lanes = buckets.lanes_for(cache.lane)
        run = self.run_for(lanes, 1, variant)
        if run is None:
            return None
        buffer = self.buffers[lanes, 1]
        buffer.load([segment], prefixes, self.scratch)
        fed = FedTokens(buffer.history[cache.lane], count)
        taken: list[int] = []
        while not taken or (len(taken) < count and not stop(taken[-1])):
            while fed.queued < min(len(taken) + 2, count):  # one run ahead of the host
                run()
                self.ran(1, 1)
                fed.queue()
            taken.append(fed.read(len(taken)))
        fed.finish()
        for layer in variant.attending:
            cache.lengths[layer] = prefixes[0] + len(taken)
        return taken

    def _in_parts(self, segment: Segment, skip: SkipMask, extra_rows) -> list[Outputs] | None:
        """A causal segment of more tokens than the largest bucket as consecutive calls of
        at most that many, each reading the entries the ones before it wrote: on a GPU,
        a 200-token prompt's prefill is four replays instead of the eager layers' launches
        (most of its time, for a small model). None where it does not fit: a mask, extra
        rows for every token, too little room in its lane, or a refused recording (found
        before any part runs, so that the eager layers can take the whole call)."""
        if segment.mask is not None or (extra_rows is not None and not segment.last_only):
            return None
        total, largest = len(segment.tokens), buckets.LARGEST
        parts = [
            Segment(
                segment.tokens[start : start + largest],
                segment.positions[start : start + largest],
                segment.cache,
                last_only=segment.last_only,
            )
            for start in range(0, total, largest)
        ]
        first = self._prefixes(parts[:1], self.variant(skip)) if self.failed is None else []
        if not first or first[0] + total > self.scratch:
            return None
        lanes = buckets.lanes_for(segment.cache.lane)  # type: ignore[attr-defined]
        extras = [None] * (len(parts) - 1) + [extra_rows]  # only the last row's, if any
        for part, extra in zip(parts, extras):
            size = buckets.bucket_for(len(part.tokens))
            assert size is not None  # each part holds at most the largest bucket's tokens
            if self.run_for(lanes, size, self.variant(skip, extra)) is None:
                return None
        outputs = []
        for part, extra in zip(parts, extras):
            done = self.forward([part], skip, extra)
            assert done is not None  # each part fits and its step is recorded
            outputs.append(done[0])
        logits = outputs[-1][0] if segment.last_only else torch.cat([o[0] for o in outputs])
        return [(logits, torch.cat([o[1] for o in outputs]), outputs[-1][2])]

    def _outputs(
        self, buffer: StepBuffers, variant: Variant, segment: Segment, prefix: int
    ) -> Outputs:
        """One segment's rows of the buffers (copies: the next run overwrites them, and
        callers keep outputs across steps); its cache's lengths moved on."""
        cache, n = segment.cache, len(segment.tokens)
        for layer in variant.attending:
            cache.lengths[layer] = prefix + n
        first = cache.lane * buffer.size  # type: ignore[attr-defined]
        rows = slice(first + n - 1 if segment.last_only else first, first + n)
        extra = None
        if variant.extra_rows is not None:  # blocks of the step's rows -> blocks of the call's
            every = buffer.extra_logits[variant]
            width = every.shape[-1]
            extra = every.view(-1, len(buffer.hidden), width)[:, rows].reshape(-1, width)
        return buffer.logits[rows].clone(), buffer.hidden[first : first + n].clone(), extra

    @torch.inference_mode()  # as a forward runs it: no autograd records in the graph
    def capture(
        self,
        sizes: tuple[int, ...] = buckets.BUCKETS,
        variant: Variant | None = None,
        lanes: int = 1,
    ) -> None:
        """Prepare (on CUDA: record) every bucket's step now rather than at its first
        call; the largest first, so that the graphs share their memory pool best.
        Needs storage: call after ``lend``."""
        if not self.keys:
            raise ValueError("the step has no cache storage yet: lend a cache first")
        variant = variant or self.variant()
        for size in sorted(sizes, reverse=True):
            self.run_for(lanes, size, variant)

    def new_buffers(self, lanes: int, size: int) -> StepBuffers:
        return StepBuffers(lanes, size, self.model, self.columns)

    def step(self, buffer: StepBuffers, variant: Variant) -> functools.partial:
        return functools.partial(self.compute, buffer, variant, self._extra_output(buffer, variant))

    def tracked(self, variant: Variant) -> bool:
        return not variant.plain  # the plain step serves every decoding: never dropped

    def _extra_output(self, buffer: StepBuffers, variant: Variant) -> torch.Tensor | None:
        """The buffer a variant's extra logits go to, sized by one eager run on idle
        inputs (the rows its callable makes are known only by calling it)."""
        if variant.extra_rows is None:
            return None
        if variant not in buffer.extra_logits:
            buffer.load_idle(self.scratch)
            self.compute(buffer, variant)
        return buffer.extra_logits[variant]

    def compute(
        self, buffer: StepBuffers, variant: Variant, extra_out: torch.Tensor | None = None
    ) -> None:
        """The step itself, over the buffers and the cache storage: the runner's
        arithmetic (``engine.layers``) with every shape fixed, the lanes as the batch of
        attention, the variant's sublayers left out and its extra rows through the same
        lm_head product (into ``extra_out``; None: into a new buffer, ``_extra_output``'s
        sizing run)."""
        model, lanes, size = self.model, buffer.lanes, buffer.size
        hidden = model.embed(buffer.tokens)  # [lanes, size, H]
        rotation = layers.Rotation(model.rotary(hidden, buffer.positions))
        writer = ColumnWriter(self.keys, self.values, buffer.columns)
        rows = [layers.AttentionSegment(size, rotation, self.visibility(buffer), writer)]
        for index, layer in enumerate(model.layers):
            qkv, gate_up = model.fused[index]
            if variant.attends[index]:
                normed = layers.rms_norm(layer.input_layernorm, hidden)
                hidden = layers.segmented_attention(
                    layer.self_attn, normed, rows, index, model.product, qkv=qkv, residual=hidden
                )
            if variant.mlps[index]:
                normed = layers.rms_norm(layer.post_attention_layernorm, hidden)
                hidden = layers.mlp(
                    layer.mlp, normed, model.product, gate_up=gate_up, residual=hidden
                )
        flat = hidden.view(lanes * size, -1)
        buffer.hidden.copy_(flat)
        normed = layers.rms_norm(model.norm, flat)  # one kernel on a GPU, not six
        if variant.extra_rows is None:
            buffer.logits.copy_(model.logits(normed))
            if variant.feeds:
                buffer.feed()
            return
        both = model.logits(torch.cat([normed, variant.extra_rows(normed)]))
        buffer.logits.copy_(both[: lanes * size])
        if extra_out is None:
            buffer.extra_logits[variant] = both[lanes * size :].clone()
        else:
            extra_out.copy_(both[lanes * size :])

    def visibility(self, buffer: StepBuffers) -> torch.Tensor:
        """The additive mask [lanes, 1, size, columns] every layer's attention takes (0:
        visible, -inf: not), made once a step on the device: each row sees its lane's
        cached prefix and, at the columns its lane's new tokens write, those its mask
        allows."""
        lanes, size = buffer.lanes, buffer.size
        earlier = buffer.column_numbers.view(1, 1, -1) < buffer.prefix.view(lanes, 1, 1)
        visible = earlier.expand(lanes, size, -1).clone()
        where = buffer.columns.view(lanes, 1, size).expand(lanes, size, size)
        visible.scatter_(2, where, buffer.new_mask)
        additive = torch.zeros(visible.shape, dtype=self.model.dtype, device=visible.device)
        return additive.masked_fill_(~visible, float("-inf")).unsqueeze(1)

    def statics(self, buffer: StepBuffers, variant: Variant) -> list[torch.Tensor]:
        """Every tensor a step reads or writes besides the model's parameters: the fused
        weights (plain tensors, not Parameters), the cache storage, the buffers."""
        fused = [f for pair in self.model.fused for f in pair]
        weights = [f.weight for f in fused] + [f.bias for f in fused if f.bias is not None]
        return [*weights, *self.keys, *self.values, *buffer.tensors()]
