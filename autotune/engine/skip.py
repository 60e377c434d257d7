"""Which sublayers a draft pass leaves out."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SkipMask:
    """Indices of the attention and MLP sublayers to skip (their residual passes through)."""

    attention: frozenset[int] = frozenset()
    mlp: frozenset[int] = frozenset()

    @classmethod
    def of(cls, attention=(), mlp=()) -> SkipMask:
        return cls(frozenset(int(i) for i in attention), frozenset(int(i) for i in mlp))

    @classmethod
    def from_bits(cls, bits: list[int] | tuple[int, ...], num_layers: int) -> SkipMask:
        """Draft & Verify's encoding: bits[:L] are attention, bits[L:] are MLP (1 = skip)."""
        if len(bits) != 2 * num_layers:
            raise ValueError(f"expected {2 * num_layers} bits, got {len(bits)}")
        return cls.of(
            [i for i in range(num_layers) if bits[i]],
            [i for i in range(num_layers) if bits[num_layers + i]],
        )

    def to_bits(self, num_layers: int) -> list[int]:
        return [int(i in self.attention) for i in range(num_layers)] + [
            int(i in self.mlp) for i in range(num_layers)
        ]

    @property
    def size(self) -> int:
        return len(self.attention) + len(self.mlp)

    def ratio(self, num_layers: int) -> float:
        return self.size / (2 * num_layers)

    def as_dict(self) -> dict[str, list[int]]:
        return {"attention": sorted(self.attention), "mlp": sorted(self.mlp)}

    def __str__(self) -> str:
        return f"attn{sorted(self.attention)} mlp{sorted(self.mlp)}"


NO_SKIP = SkipMask()
