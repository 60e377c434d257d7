"""A per-layer key/value cache that can be cropped and compacted.

Each layer keeps its own length: a draft pass that skips a layer's attention writes
nothing there, so layers may briefly disagree until verification crops them back.
"""

from __future__ import annotations

import torch

_GROWTH = 256  # tokens added per reallocation; decode lengths here are a few hundred


class KVCache:
    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
        capacity: int = 512,
    ):
        shape = (1, num_kv_heads, capacity, head_dim)
        self.keys = [torch.empty(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.empty(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.lengths = [0] * num_layers

    @classmethod
    def for_config(
        cls, config, num_layers: int, dtype: torch.dtype, device, capacity: int = 512
    ) -> KVCache:
        """A cache shaped for the attention of a LLaMA-family ``config``."""
        head_dim = (
            getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        )
        return cls(num_layers, config.num_key_value_heads, head_dim, dtype, device, capacity)

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2]

    def length(self, layer: int) -> int:
        return self.lengths[layer]

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int):
        """Append key/value [1, kv_heads, S, head_dim]; return the layer's whole cache.

        Named and shaped like transformers' ``Cache.update`` so that the model's own
        attention modules can write into it.
        """
        start = self.lengths[layer_idx]
        end = start + key.shape[2]
        self.reserve(layer_idx, end)
        self.keys[layer_idx][:, :, start:end] = key
        self.values[layer_idx][:, :, start:end] = value
        self.lengths[layer_idx] = end
        return self.keys[layer_idx][:, :, :end], self.values[layer_idx][:, :, :end]

    def reserve(self, layer: int, length: int) -> None:
        """Make room for ``length`` tokens in ``layer`` (keeping its contents)."""
        if length > self.keys[layer].shape[2]:
            self._grow(layer, length)

    def _grow(self, layer: int, needed: int) -> None:
        for store in (self.keys, self.values):
            store[layer] = _resized(store[layer], self.lengths[layer], needed + _GROWTH)

    def copy(self, capacity: int) -> KVCache:
        """A cache holding the same entries, with room for ``capacity`` tokens."""
        out = KVCache.__new__(KVCache)
        out.keys, out.values = [
            [_resized(t, n, max(capacity, n)) for t, n in zip(store, self.lengths)]
            for store in (self.keys, self.values)
        ]
        out.lengths = list(self.lengths)
        return out

    def take(self, other: KVCache) -> None:
        """Hold a copy of ``other``'s entries, in this cache's own storage (which a
        fixed-shape step may have lent it: replacing the cache would lose that)."""
        for layer, length in enumerate(other.lengths):
            self.reserve(layer, length)
            self.keys[layer][:, :, :length] = other.keys[layer][:, :, :length]
            self.values[layer][:, :, :length] = other.values[layer][:, :, :length]
        self.lengths = list(other.lengths)

    @property
    def nbytes(self) -> int:
        """The bytes its entries take (not its spare room)."""
        return sum(
            2 * n * t[:, :, :1].numel() * t.element_size() for n, t in zip(self.lengths, self.keys)
        )

    def crop(self, length: int) -> None:
        """Forget everything at or after ``length`` in every layer."""
        self.lengths = [min(n, length) for n in self.lengths]

    def keep(self, start: int, offsets: torch.Tensor) -> None:
        """Keep positions ``start + offsets`` (ascending) and move them to ``start``.

        Used after tree verification: the accepted path's entries are scattered among
        the tree's, and must become contiguous.
        """
        index = offsets.to(self.keys[0].device) + start
        n = int(offsets.numel())
        for layer in range(len(self.keys)):
            if self.lengths[layer] <= start:
                continue
            for store in (self.keys, self.values):
                store[layer][:, :, start : start + n] = store[layer].index_select(2, index)
            self.lengths[layer] = start + n


def _resized(store: torch.Tensor, length: int, capacity: int) -> torch.Tensor:
    """A new store [1, heads, capacity, D] holding the first ``length`` entries."""
    out = store.new_empty((*store.shape[:2], capacity, store.shape[3]))
    out[:, :, :length] = store[:, :, :length]
    return out
