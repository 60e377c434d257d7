"""The runner's fixed-shape step, which a GPU records once and replays.

Eager on a GPU, a step is launch overhead: Vicuna-13B in float16 took 17.7 ms a token on
an H200 where a CUDA-graph forward of the same model took 9.1. A graph replays fixed
kernels on fixed memory, so this step has one shape per bucket (``engine.buckets``):
its inputs are copied into buffers made once, every row writes its keys and values into
a KV cache allocated once at a fixed capacity (``index_copy_`` at its column, the padded
rows at a scratch column), attention reads the whole capacity under a visibility mask
made on the device from the prefix length and the new tokens' mask, and the logits land
in an output buffer. Nothing in it reads a value back to the host.

``StaticStep`` owns the cache storage and lends it (``lend``) as a ``StaticCache``, the
runner's cache for one sequence at a time; ``forward`` runs a call that fits the step
(the runner falls back to its eager layers for the others). A call may leave sublayers
out (a layer-skip draft) or ask for extra logits rows (Medusa's heads over the verify
forward's lm_head product): each such ``Variant`` is a step of its own per bucket, and
the few most recently used are kept. ``how`` says how the step
runs on CUDA (``engine.capture``): ``graph`` (one ``torch.cuda.CUDAGraph`` per bucket and
variant), ``compile`` (``torch.compile(mode="reduce-overhead")`` of the same step, so that
the two can be timed against each other) or ``eager``; elsewhere it always runs eagerly,
which is what the CPU tests check against the runner's own layers.
"""

from __future__ import annotations

import collections
import functools
import os
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from autotune.engine import buckets, layers
from autotune.engine.capture import HOWS, SWITCH_ENV, Recorder, Run
from autotune.engine.kvcache import KVCache
from autotune.engine.layers import Fused, Product
from autotune.engine.segment import Segment
from autotune.engine.skip import NO_SKIP, SkipMask

# Variants (skip masks, extra rows) whose steps are kept besides the plain one: a decoding
# uses one (its drafter's), a layer-skip search a new mask every trial; dropping the
# least recent bounds the graphs held while a search runs
KEPT_VARIANTS = 4


@dataclass(frozen=True)
class Variant:
    """What a call computes besides the plain forward: per layer, whether its attention
    and its MLP run (False: skipped, the residual passes through), and the callable that
    makes extra rows for the lm_head (``Runner.forward``'s ``extra_rows``; hashable, and
    equal from one decoding to the next, so that its steps are made once)."""

    attends: tuple[bool, ...]
    mlps: tuple[bool, ...]
    extra_rows: Callable[[torch.Tensor], torch.Tensor] | None = None

    @classmethod
    def of(cls, layers: int, skip: SkipMask = NO_SKIP, extra_rows=None) -> Variant:
        # tuples of bools rather than the mask's sets: constants torch.compile reads plainly
        return cls(
            tuple(i not in skip.attention for i in range(layers)),
            tuple(i not in skip.mlp for i in range(layers)),
            extra_rows,
        )

    @property
    def plain(self) -> bool:
        return all(self.attends) and all(self.mlps) and self.extra_rows is None


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


class StaticCache(KVCache):
    """A ``KVCache`` over the storage of a ``StaticStep``, lent to one sequence: crop,
    keep (in place) and lengths work as on any cache, but it never reallocates that
    storage. When it must hold more than its capacity, or the step lends the storage to
    another sequence while this one is still alive, its entries move to storage of its
    own (``give_back``): from then on it is an ordinary cache and runs eagerly."""

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor]):
        # lists of its own: a growing layer replaces its entry, never the step's
        self.keys, self.values = list(keys), list(values)
        self.lengths = [0] * len(keys)
        self.on_loan = True

    def give_back(self) -> None:
        """Copy the entries into storage of its own; the step's storage is no longer read."""
        if self.on_loan:
            own = self.copy(self.capacity)
            self.keys, self.values, self.on_loan = own.keys, own.values, False

    def _grow(self, layer: int, needed: int) -> None:
        self.give_back()
        super()._grow(layer, needed)


class StepBuffers:
    """One bucket's inputs and outputs, made once; a replay reads and writes only these
    and the cache storage. ``columns``: the cache column each row writes; ``new_mask``:
    which new tokens each row sees (True = may attend); ``prefix``: the cached entries
    before them, as a 0-d tensor."""

    def __init__(self, size: int, model: StepModel):
        device, hidden = model.device, model.config.hidden_size
        self.size = size
        self.tokens = torch.zeros(size, dtype=torch.long, device=device)
        self.positions = torch.zeros(size, dtype=torch.long, device=device)
        self.columns = torch.zeros(size, dtype=torch.long, device=device)
        self.new_mask = torch.ones(size, size, dtype=torch.bool, device=device)
        self.prefix = torch.zeros((), dtype=torch.long, device=device)
        self.rows = torch.arange(size, device=device)
        self.causal = torch.ones(size, size, dtype=torch.bool, device=device).tril()
        self.hidden = torch.zeros(size, hidden, dtype=model.dtype, device=device)
        self.logits = torch.zeros(size, model.config.vocab_size, device=device)
        # a variant's extra logits rows, made at its first (eager) run, before any capture
        self.extra_logits: dict[Variant, torch.Tensor] = {}

    def tensors(self) -> list[torch.Tensor]:
        return [v for v in vars(self).values() if isinstance(v, torch.Tensor)] + list(
            self.extra_logits.values()
        )

    def load(self, segment: Segment, prefix: int, scratch: int) -> None:
        """The call's tokens, positions and mask, its rows writing at ``prefix`` onward
        and the padded ones at ``scratch``: copies and fills on the device, no sync."""
        n = len(segment.tokens)
        self.tokens[:n].copy_(segment.tokens)
        self.positions[:n].copy_(segment.positions)
        self.prefix.fill_(prefix)
        torch.add(self.rows, prefix, out=self.columns)
        self.columns[n:] = scratch
        self.new_mask.fill_(False)
        self.new_mask[:n, :n] = self.causal[:n, :n] if segment.mask is None else segment.mask
        # every padded row maps to the scratch column with the same mask column (real
        # rows: no, padded rows: yes), so the scatter in ``visibility`` agrees on it
        self.new_mask[n:, n:] = True

    def load_idle(self, scratch: int) -> None:
        """Inputs whose every row is padding: a run writes the scratch column only (the
        warm-up and capture runs, while a sequence's entries sit in the cache)."""
        self.prefix.fill_(0)
        self.columns.fill_(scratch)
        self.new_mask.fill_(True)


class _ColumnWriter:
    """The cache as ``layers.segmented_attention`` uses it (``update``): each row's keys
    and values go to its column, and attention reads every column of the layer."""

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor], columns):
        self.keys, self.values, self.columns = keys, values, columns

    def update(self, key: torch.Tensor, value: torch.Tensor, layer: int):
        self.keys[layer].index_copy_(2, self.columns, key)
        self.values[layer].index_copy_(2, self.columns, value)
        return self.keys[layer], self.values[layer]


def enabled_by_default(device: torch.device) -> bool:
    """On a GPU, unless ``AUTOTUNE_STATIC=0``; never on a CPU, whose path stays as it was."""
    return device.type == "cuda" and os.environ.get(SWITCH_ENV, "1") != "0"


def unsupported(model: StepModel, how: str) -> str | None:
    """Why the step cannot run this runner's model, or None when it can."""
    if how not in HOWS:
        raise ValueError(f"how must be one of {', '.join(HOWS)}, not {how!r}")
    rope = getattr(model.rotary, "rope_type", "default")
    if "dynamic" in rope or rope == "longrope":
        # these recompute their frequencies from the largest position: a host sync
        return f"rotary embedding {rope!r} reads the positions on the host"
    return None


class StaticStep:
    """The fixed-shape step over a runner's weights, one bucket at a time, and the KV
    storage it owns (see the module's docstring)."""

    def __init__(self, model: StepModel, how: str = "graph"):
        self.model = model
        self.recorder = Recorder(model.device, how)
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.buffers: dict[int, StepBuffers] = {}
        # (bucket, variant) -> run its step once
        self._runs: dict[tuple[int, Variant], Run] = {}
        self._variants: collections.OrderedDict[Variant, None] = collections.OrderedDict()
        self.column_numbers = torch.zeros(0, dtype=torch.long)  # 0 .. columns - 1
        self._borrower: weakref.ref[StaticCache] | None = None
        self.calls: collections.Counter[int] = collections.Counter()  # bucket -> runs

    @property
    def how(self) -> str:
        return self.recorder.how

    @property
    def failed(self) -> str | None:
        """Why recording failed (the runner runs eagerly from then on), or None."""
        return self.recorder.failed

    @classmethod
    def of(cls, model: StepModel, how: str = "graph") -> StaticStep | None:
        return None if unsupported(model, how) else cls(model, how)

    @property
    def columns(self) -> int:
        """The cache storage's columns, the scratch column last (0 before any is lent)."""
        return self.keys[0].shape[2] if self.keys else 0

    def lend(self, capacity: int) -> StaticCache:
        """The storage as an empty cache for ``capacity`` tokens, for one sequence: the
        previous borrower, if still alive, moves its entries out first. Storage too
        small is replaced by storage for ``capacity`` (and the steps recorded over the
        old one dropped): it only grows, rounded up (``buckets.static_columns``)."""
        previous = self._borrower() if self._borrower is not None else None
        if previous is not None:
            previous.give_back()
        if capacity + buckets.SCRATCH_COLUMNS > self.columns:
            self._allocate(buckets.static_columns(capacity))
        cache = StaticCache(self.keys, self.values)
        self._borrower = weakref.ref(cache)
        return cache

    def _allocate(self, columns: int) -> None:
        model = self.model
        storage = KVCache.for_config(
            model.config, model.num_layers, model.dtype, model.device, columns
        )
        for tensor in (*storage.keys, *storage.values):
            # zeros, not garbage: attention reads every column, and 0 x NaN is NaN
            tensor.zero_()
        self.keys, self.values = storage.keys, storage.values
        self.column_numbers = torch.arange(columns, device=model.device)
        self._runs.clear()
        self.recorder.forget()

    def variant(self, skip: SkipMask = NO_SKIP, extra_rows=None) -> Variant:
        return Variant.of(self.model.num_layers, skip, extra_rows)

    def fits(self, segment: Segment, variant: Variant | None = None) -> bool:
        """Whether ``forward`` can run this call: the borrower's cache, the layers whose
        attention runs at one length (a skipped layer's may lag: a draft leaves it
        unwritten), a bucket for its tokens, room before the scratch column, and a mask
        over the new tokens only (None: causal)."""
        cache, n = segment.cache, len(segment.tokens)
        if self.failed is not None or not isinstance(cache, StaticCache) or not cache.on_loan:
            return False
        if self._borrower is None or self._borrower() is not cache:
            return False
        attends = (variant or self.variant()).attends
        lengths = {length for length, runs in zip(cache.lengths, attends) if runs}
        if len(lengths) != 1:  # none (every attention skipped: rare, eager) or several
            return False
        prefix, mask = lengths.pop(), segment.mask
        return (
            1 <= n <= buckets.LARGEST
            and prefix + n <= self.columns - buckets.SCRATCH_COLUMNS
            and (mask is None or tuple(mask.shape) == (n, n))
        )

    def forward(
        self, segment: Segment, skip: SkipMask = NO_SKIP, extra_rows=None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None:
        """(logits [n, V] float32, or [1, V] for ``last_only``; hidden [n, H]; the extra
        rows' logits or None) of the call, its keys and values appended to its cache in
        the layers whose attention runs, as ``Runner.forward`` returns them; None when it
        does not fit (``fits``)."""
        variant = self.variant(skip, extra_rows)
        if not self.fits(segment, variant):
            return None
        cache, n = segment.cache, len(segment.tokens)
        size = buckets.bucket_for(n)
        assert size is not None  # fits() checked n against the largest bucket
        attending = [i for i, runs in enumerate(variant.attends) if runs]
        prefix = cache.lengths[attending[0]]
        run = self._runs.get((size, variant)) or self._prepare(size, variant)
        if run is None:  # the capture failed: said once, and the runner runs eagerly
            return None
        buffer = self.buffers[size]
        buffer.load(segment, prefix, self.columns - buckets.SCRATCH_COLUMNS)
        run()
        self.calls[size] += 1
        for layer in attending:
            cache.lengths[layer] = prefix + n
        # copies: the next run overwrites the buffers, callers keep outputs across steps
        rows = slice(n - 1, n) if segment.last_only else slice(0, n)
        extra = None
        if variant.extra_rows is not None:  # blocks of ``size`` rows -> blocks of the call's
            every = buffer.extra_logits[variant]
            extra = every.view(-1, size, every.shape[-1])[:, rows].reshape(-1, every.shape[-1])
        return buffer.logits[rows].clone(), buffer.hidden[:n].clone(), extra

    @torch.inference_mode()  # as a forward runs it: no autograd records in the graph
    def capture(self, sizes: tuple[int, ...] = buckets.BUCKETS, variant: Variant | None = None):
        """Prepare (on CUDA: record) every bucket's step now rather than at its first
        call; the largest first, so that the graphs share their memory pool best.
        Needs storage: call after ``lend``."""
        if not self.keys:
            raise ValueError("the step has no cache storage yet: lend a cache first")
        variant = variant or self.variant()
        for size in sorted(sizes, reverse=True):
            if (size, variant) not in self._runs:
                self._prepare(size, variant)

    def _prepare(self, size: int, variant: Variant) -> Run | None:
        if size not in self.buffers:
            self.buffers[size] = StepBuffers(size, self.model)
        buffer = self.buffers[size]
        self._keep(variant)
        step = functools.partial(self.compute, buffer, variant, self._extra_output(buffer, variant))
        buffer.load_idle(self.columns - buckets.SCRATCH_COLUMNS)  # recording writes scratch only
        run = self.recorder.make(step, self._statics(buffer), f"the engine's {size}-token step")
        if run is not None:
            self._runs[size, variant] = run
        return run

    def _keep(self, variant: Variant) -> None:
        """Mark ``variant`` as the most recently used; past ``KEPT_VARIANTS`` besides the
        plain step, the least recent one's steps and outputs are dropped."""
        if variant.plain:
            return
        self._variants[variant] = None
        self._variants.move_to_end(variant)
        while len(self._variants) > KEPT_VARIANTS:
            dropped, _ = self._variants.popitem(last=False)
            for key in [key for key in self._runs if key[1] == dropped]:
                del self._runs[key]
            for buffer in self.buffers.values():
                buffer.extra_logits.pop(dropped, None)

    def _extra_output(self, buffer: StepBuffers, variant: Variant) -> torch.Tensor | None:
        """The buffer a variant's extra logits go to, sized by one eager run on idle
        inputs (the rows its callable makes are known only by calling it)."""
        if variant.extra_rows is None:
            return None
        if variant not in buffer.extra_logits:
            buffer.load_idle(self.columns - buckets.SCRATCH_COLUMNS)
            self.compute(buffer, variant)
        return buffer.extra_logits[variant]

    def compute(
        self, buffer: StepBuffers, variant: Variant, extra_out: torch.Tensor | None = None
    ) -> None:
        """The step itself, over the bucket's buffers and the cache storage: the runner's
        arithmetic (``engine.layers``) with every shape fixed by the bucket, the
        variant's sublayers left out and its extra rows through the same lm_head product
        (into ``extra_out``; None: into a new buffer, ``_extra_output``'s sizing run)."""
        model, size = self.model, buffer.size
        hidden = model.embed(buffer.tokens.view(1, size))
        rotation = layers.Rotation(model.rotary(hidden, buffer.positions.view(1, size)))
        writer = _ColumnWriter(self.keys, self.values, buffer.columns)
        rows = [layers.AttentionSegment(size, rotation, self.visibility(buffer), writer)]
        for index, layer in enumerate(model.layers):
            qkv, gate_up = model.fused[index]
            if variant.attends[index]:
                normed = layers.rms_norm(layer.input_layernorm, hidden)
                hidden = hidden + layers.segmented_attention(
                    layer.self_attn, normed, rows, index, model.product, qkv=qkv
                )
            if variant.mlps[index]:
                normed = layers.rms_norm(layer.post_attention_layernorm, hidden)
                hidden = hidden + layers.mlp(layer.mlp, normed, model.product, gate_up=gate_up)
        buffer.hidden.copy_(hidden[0])
        normed = model.norm(hidden[0])
        if variant.extra_rows is None:
            buffer.logits.copy_(model.logits(normed))
            return
        both = model.logits(torch.cat([normed, variant.extra_rows(normed)]))
        buffer.logits.copy_(both[:size])
        if extra_out is None:
            buffer.extra_logits[variant] = both[size:].clone()
        else:
            extra_out.copy_(both[size:])

    def visibility(self, buffer: StepBuffers) -> torch.Tensor:
        """The additive mask [B, columns] every layer's attention takes (0: visible,
        -inf: not), made once a step on the device: each row sees the cached prefix and,
        at the columns the new tokens write, the new tokens its mask allows."""
        earlier = self.column_numbers < buffer.prefix
        visible = earlier.expand(buffer.size, -1).clone()
        visible.index_copy_(1, buffer.columns, buffer.new_mask)
        additive = torch.zeros(visible.shape, dtype=self.model.dtype, device=visible.device)
        return additive.masked_fill_(~visible, float("-inf"))

    def _statics(self, buffer: StepBuffers) -> list[torch.Tensor]:
        """Every tensor a bucket's step reads or writes besides the model's parameters:
        the fused weights (plain tensors, not Parameters), the cache storage, the buffers."""
        fused = [f for pair in self.model.fused for f in pair]
        weights = [f.weight for f in fused] + [f.bias for f in fused if f.bias is not None]
        return [*weights, *self.keys, *self.values, self.column_numbers, *buffer.tensors()]
