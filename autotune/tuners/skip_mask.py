"""Which sublayers the self-speculative draft skips: Bayesian optimisation over the
2L-bit mask, on a proxy (teacher-forced draft traces replayed with measured costs)."""
from __future__ import annotations

from dataclasses import dataclass

from autotune.engine.skip import SkipMask
from autotune.measure.costs import SublayerCosts
from autotune.models.ref import TargetRef
from autotune.process_cache import cached
from autotune.tuners.chain_model import best_static_policy
from autotune.tuners.space import SkipMaskSpace


def param_name(kind: str, layer: int) -> str:
    return f"{kind}_{layer:03d}"


def search_distributions(space: SkipMaskSpace, num_layers: int) -> dict:
    from optuna.distributions import IntDistribution

    return {param_name(kind, layer): IntDistribution(0, 1)
            for kind in ("attn", "mlp") for layer in space.skippable_layers(num_layers)}


def mask_from_params(params: dict) -> SkipMask:
    attention = [int(k[5:]) for k, v in params.items() if k.startswith("attn_") and v]
    mlp = [int(k[4:]) for k, v in params.items() if k.startswith("mlp_") and v]
    return SkipMask.of(attention, mlp)


def params_from_mask(mask: SkipMask, space: SkipMaskSpace, num_layers: int) -> dict:
    layers = space.skippable_layers(num_layers)
    return {**{param_name("attn", i): int(i in mask.attention) for i in layers},
            **{param_name("mlp", i): int(i in mask.mlp) for i in layers}}


def middle_attention_mask(num_layers: int, fraction: float = 0.4) -> SkipMask:
    """Skip the middle ``fraction`` of the attention sublayers."""
    count = max(1, round(num_layers * fraction))
    start = (num_layers - count) // 2
    return SkipMask.of(attention=range(start, start + count))


def seed_masks(space: SkipMaskSpace, num_layers: int) -> list[SkipMask]:
    """Warm starts: shapes that published layer-skip searches tend to end up near
    (middle blocks, attention-heavy skips, every other layer in the upper half)."""
    layers = space.skippable_layers(num_layers)
    middle = layers[len(layers) // 4: len(layers) - len(layers) // 4]
    upper_alternate = [i for i in layers if i >= num_layers // 2 and i % 2 == 1]
    allowed = set(layers)
    middle_attention = middle_attention_mask(num_layers).attention & allowed
    seeds = [
        SkipMask(attention=middle_attention),
        SkipMask.of(attention=middle, mlp=middle[len(middle) // 3: -len(middle) // 3 or None]),
        SkipMask.of(attention=upper_alternate, mlp=upper_alternate),
        SkipMask.of(attention=[i for i in layers if i % 2 == 0]),
    ]
    total = 2 * num_layers
    feasible = [s for s in seeds
                if space.min_skip_ratio <= s.size / total <= space.max_skip_ratio]
    return list(dict.fromkeys(feasible))


@dataclass
class SkipMaskObjective:
    """A Ray Tune trial: the proxy speedup of one mask. Uses no wall-clock time itself,
    so trials may run side by side."""

    target: TargetRef
    sequences: list[tuple[list[int], list[int]]]
    costs: SublayerCosts
    verify_relative: list[float]
    space: SkipMaskSpace

    def __call__(self, config: dict) -> dict:
        from autotune.measure.draft_trace import DraftTracer

        skip = mask_from_params(config)
        ratio = skip.ratio(self.costs.num_layers)
        if not (self.space.min_skip_ratio <= ratio <= self.space.max_skip_ratio) or not skip.size:
            return {"objective": 0.0, "skip_ratio": ratio, "feasible": False}
        tracer = cached(("tracer", self.target, id_of(self.sequences)),
                        lambda: DraftTracer(self.target.runner(), self.sequences))
        traces = tracer.traces(skip)
        draft_ratio = self.costs.draft_ratio(skip)
        best = best_static_policy(traces, draft_ratio, self.verify_relative,
                                  self.space.max_tokens_choices, self.space.exit_threshold_choices)
        first_token = sum(int(t.matches.sum()) for t in traces) / sum(len(t.matches) for t in traces)
        return {"objective": best.speedup, "feasible": True, "skip_ratio": ratio,
                "acceptance": first_token, "draft_ratio": draft_ratio,
                "max_tokens": best.max_tokens, "exit_threshold": best.exit_threshold,
                "tokens_per_step": best.tokens_per_step}


def id_of(sequences) -> int:
    return hash(tuple((tuple(p), tuple(c)) for p, c in sequences))
