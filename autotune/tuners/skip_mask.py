"""Skip masks worth starting a search from. Pure functions."""

from __future__ import annotations

from autotune.engine.skip import SkipMask


def middle_attention_mask(num_layers: int, fraction: float = 0.4) -> SkipMask:
    """Skip the middle ``fraction`` of the attention sublayers."""
    count = max(1, round(num_layers * fraction))
    start = (num_layers - count) // 2
    return SkipMask.of(attention=range(start, start + count))


def seed_masks(
    layers: list[int], num_layers: int, min_ratio: float, max_ratio: float
) -> list[SkipMask]:
    """Warm starts over the skippable ``layers``: shapes that published layer-skip searches
    tend to end up near (middle blocks, attention-heavy skips, every other layer in the
    upper half), those whose skip ratio lies within [min_ratio, max_ratio]."""
    middle = layers[len(layers) // 4 : len(layers) - len(layers) // 4]
    upper_alternate = [i for i in layers if i >= num_layers // 2 and i % 2 == 1]
    allowed = set(layers)
    middle_attention = middle_attention_mask(num_layers).attention & allowed
    seeds = [
        SkipMask(attention=middle_attention),
        SkipMask.of(attention=middle, mlp=middle[len(middle) // 3 : -len(middle) // 3 or None]),
        SkipMask.of(attention=upper_alternate, mlp=upper_alternate),
        SkipMask.of(attention=[i for i in layers if i % 2 == 0]),
    ]
    total = 2 * num_layers
    feasible = [s for s in seeds if s.size and min_ratio <= s.size / total <= max_ratio]
    return list(dict.fromkeys(feasible))
