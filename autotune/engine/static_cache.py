"""The fixed KV storage a fixed-shape step (``engine.static``) attends over, and the
caches it lends out of it.

The storage holds ``lanes`` sequences side by side, each at most ``columns`` entries,
the last column of each lane a scratch column (``engine.buckets``). Each sequence gets a
lane as a ``StaticCache``: a ``KVCache`` whose layers are views of that lane, so the
eager layers (a long prefill, say) write into the same memory the step reads. The
storage only grows (more lanes, more columns); when it does, the caches still alive
move their entries into the new one, and the steps recorded over the old are dropped.
"""

from __future__ import annotations

import gc
import itertools
import weakref

import torch

from autotune.engine import buckets
from autotune.engine.kvcache import KVCache


class StaticCache(KVCache):
    """A ``KVCache`` over one lane of a step's storage, lent to one sequence: crop, keep
    (in place) and lengths work as on any cache, but it never reallocates that storage.
    When it must hold more than its capacity, or its lane is taken for another sequence,
    its entries move to storage of its own (``give_back``): from then on it is an
    ordinary cache and runs eagerly."""

    def __init__(
        self,
        keys: list[torch.Tensor],
        values: list[torch.Tensor],
        lane: int = 0,
        stacked: tuple[torch.Tensor, torch.Tensor] | None = None,
    ):
        # lists of its own: a growing layer replaces its entry, never the step's
        self.keys, self.values = list(keys), list(values)
        self.lengths = [0] * len(keys)
        self.on_loan = True
        self.lane = lane
        # the lane's keys and values of every layer at once [layers, kv_heads, columns, D]
        # (``keep``), where the storage lays its layers out in one tensor
        self.stacked = stacked

    def give_back(self) -> None:
        """Copy the entries into storage of its own; the step's storage is no longer read."""
        if self.on_loan:
            own = self.copy(self.capacity)
            self.keys, self.values, self.on_loan = own.keys, own.values, False
            self.stacked = None

    def move_into(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Copy the entries into the same lane of new storage ([layers, lanes, ...]) and
        read and write there from now on."""
        lane = slice(self.lane, self.lane + 1)
        for layer, length in enumerate(self.lengths):
            keys[layer, lane, :, :length] = self.keys[layer][:, :, :length]
            values[layer, lane, :, :length] = self.values[layer][:, :, :length]
        self.keys = [store[lane] for store in keys.unbind(0)]
        self.values = [store[lane] for store in values.unbind(0)]
        self.stacked = (keys[:, self.lane], values[:, self.lane])

    def keep(self, start: int, offsets: torch.Tensor) -> None:
        """As ``KVCache.keep``, every layer at once where they all hold entries past
        ``start`` (after a verification they do): on a GPU, four launches instead of four
        a layer (120 for a 30-layer model, about as long as the verify step itself)."""
        if self.stacked is None or min(self.lengths) <= start:
            super().keep(start, offsets)
            return
        index = offsets.to(self.stacked[0].device) + start
        count = int(offsets.numel())
        for store in self.stacked:
            store[:, :, start : start + count] = store.index_select(2, index)
        self.lengths = [start + count] * len(self.lengths)

    def reserve(self, layer: int, length: int) -> None:
        # the lane's last column is the step's scratch: an entry there would be
        # overwritten by the next padded row, so reaching it moves the entries out
        if self.on_loan and length > self.capacity - buckets.SCRATCH_COLUMNS:
            self.give_back()
        super().reserve(layer, length)

    def _grow(self, layer: int, needed: int) -> None:
        self.give_back()
        super()._grow(layer, needed)


class LaneStorage:
    """The storage (per layer, keys and values [lanes, kv_heads, columns, head_dim]) and
    which cache holds each lane. ``version`` changes whenever the storage is replaced,
    so that the step drops what it recorded over the old one."""

    def __init__(self, config, num_layers: int, dtype: torch.dtype, device: torch.device):
        self.config, self.num_layers, self.dtype, self.device = config, num_layers, dtype, device
        self.keys: list[torch.Tensor] = []  # per layer: views of the stacked tensors
        self.values: list[torch.Tensor] = []
        self._stacked: tuple[torch.Tensor, torch.Tensor] | None = None  # [layers, lanes, ...]
        self._borrowers: dict[int, weakref.ref[StaticCache]] = {}
        self._lent_at: dict[int, int] = {}  # lane -> when it was lent (eviction order)
        self._clock = itertools.count()
        self.version = 0

    @property
    def lanes(self) -> int:
        return self.keys[0].shape[0] if self.keys else 0

    @property
    def columns(self) -> int:
        """Each lane's columns, the scratch column last (0 before any is lent)."""
        return self.keys[0].shape[2] if self.keys else 0

    def holds(self, cache: StaticCache) -> bool:
        """Whether ``cache`` is the live borrower of its lane here."""
        borrower = self._borrowers.get(cache.lane)
        return cache.on_loan and borrower is not None and borrower() is cache

    def live(self) -> dict[int, StaticCache]:
        found = {lane: ref() for lane, ref in self._borrowers.items()}
        return {lane: cache for lane, cache in found.items() if cache is not None and cache.on_loan}

    def lend(self, capacity: int, lane: int | None = None) -> StaticCache:
        """A free lane as an empty cache for ``capacity`` tokens, or lane ``lane`` (a
        draft's cache takes its sequence's lane of the target's storage; a cache still
        there gives it back). Too few columns: new storage with enough (rounded up,
        ``buckets.static_columns``). Every lane taken: twice the lanes, up to the last
        of ``buckets.LANES``; past it, the sequence lent its lane longest ago gives it
        back."""
        if lane is None and self.keys and len(self.live()) == self.lanes:
            # a cache in a reference cycle outlives its decoding until the collector runs:
            # collect before taking more memory (a lane of a 13B model's 2048 columns is
            # 1.7 GB) for a sequence that is gone (and hold no reference while it runs)
            gc.collect()
        live = self.live()
        if lane is not None and lane in live:
            live.pop(lane).give_back()
        columns = max(self.columns, buckets.static_columns(capacity))
        lanes = max(self.lanes, 1)
        if lane is not None:
            lanes = max(lanes, buckets.lanes_for(lane))
        elif len(live) == lanes and lanes < buckets.LANES[-1]:
            lanes = buckets.lanes_for(lanes)
        if (lanes, columns) != (self.lanes, self.columns):
            self._allocate(lanes, columns, live)
        if lane is None:
            lane = self._free_lane(live)
        one = slice(lane, lane + 1)
        assert self._stacked is not None  # allocated above
        stacked = (self._stacked[0][:, lane], self._stacked[1][:, lane])
        cache = StaticCache(
            [s[one] for s in self.keys], [s[one] for s in self.values], lane, stacked
        )
        self._borrowers[lane] = weakref.ref(cache)
        self._lent_at[lane] = next(self._clock)
        return cache

    def _free_lane(self, live: dict[int, StaticCache]) -> int:
        """The first lane no live cache holds; none: the one lent longest ago, given back."""
        free = [lane for lane in range(self.lanes) if lane not in live]
        if free:
            return free[0]
        oldest = min(live, key=self._lent_at.__getitem__)
        live[oldest].give_back()
        return oldest

    def _allocate(self, lanes: int, columns: int, live: dict[int, StaticCache]) -> None:
        config = self.config
        head_dim = (
            getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        )
        # every layer in one tensor, so that a cache's entries can move in all layers at
        # once (``StaticCache.keep``); zeros, not garbage: attention reads every column,
        # and 0 x NaN is NaN
        shape = (self.num_layers, lanes, config.num_key_value_heads, columns, head_dim)
        keys, values = (torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in "kv")
        for cache in live.values():
            cache.move_into(keys, values)
        self._stacked = (keys, values)
        self.keys, self.values = list(keys.unbind(0)), list(values.unbind(0))
        self.version += 1
