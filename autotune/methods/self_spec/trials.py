"""The self-speculative studies' trials (run by Ray Tune workers) and the conversion
between their Optuna parameters and masks or policies."""

from __future__ import annotations

from dataclasses import dataclass

from autotune.drafters.self_spec import AdaptiveExit, DraftExitPolicy, LayerSkipDrafter
from autotune.engine.skip import SkipMask
from autotune.measure.costs import SublayerCosts
from autotune.measure.timing import EncodedPrompt
from autotune.methods.self_spec.space import DraftExitSpace, SkipMaskSpace
from autotune.methods.trial import measure_lossless
from autotune.models.ref import TargetRef
from autotune.process_cache import cached

Sequences = list[tuple[list[int], list[int]]]  # (prompt ids, greedy continuation)


# --- skip masks ---------------------------------------------------------------------


def param_name(kind: str, layer: int) -> str:
    return f"{kind}_{layer:03d}"


def mask_distributions(space: SkipMaskSpace, num_layers: int) -> dict:
    from optuna.distributions import IntDistribution

    return {
        param_name(kind, layer): IntDistribution(0, 1)
        for kind in ("attn", "mlp")
        for layer in space.skippable_layers(num_layers)
    }


def mask_from_params(params: dict) -> SkipMask:
    attention = [int(k[5:]) for k, v in params.items() if k.startswith("attn_") and v]
    mlp = [int(k[4:]) for k, v in params.items() if k.startswith("mlp_") and v]
    return SkipMask.of(attention, mlp)


def params_from_mask(mask: SkipMask, space: SkipMaskSpace, num_layers: int) -> dict:
    layers = space.skippable_layers(num_layers)
    return {
        **{param_name("attn", i): int(i in mask.attention) for i in layers},
        **{param_name("mlp", i): int(i in mask.mlp) for i in layers},
    }


def sequences_id(sequences: Sequences) -> int:
    return hash(tuple((tuple(p), tuple(c)) for p, c in sequences))


@dataclass
class SkipMaskObjective:
    """A trial: the proxy speedup of one mask (teacher-forced draft traces replayed with
    measured costs). Times nothing itself, so trials may run side by side."""

    target: TargetRef
    sequences: Sequences
    costs: SublayerCosts
    verify_relative: list[float]
    space: SkipMaskSpace

    def __call__(self, config: dict) -> dict:
        return self.evaluate(mask_from_params(config))

    def evaluate(self, skip: SkipMask) -> dict:
        from autotune.measure.draft_trace import DraftTracer
        from autotune.tuners.chain_model import best_static_policy

        ratio = skip.ratio(self.costs.num_layers)
        if not (self.space.min_skip_ratio <= ratio <= self.space.max_skip_ratio) or not skip.size:
            return {"objective": 0.0, "skip_ratio": ratio, "feasible": False}
        tracer = cached(
            ("tracer", self.target, sequences_id(self.sequences)),
            lambda: DraftTracer(self.target.runner(), self.sequences),
        )
        traces = tracer.traces(skip)
        draft_ratio = self.costs.draft_ratio(skip)
        best = best_static_policy(
            traces,
            draft_ratio,
            self.verify_relative,
            self.space.max_tokens_choices,
            self.space.exit_threshold_choices,
        )
        first_token = sum(int(t.matches.sum()) for t in traces) / sum(
            len(t.matches) for t in traces
        )
        return {
            "objective": best.speedup,
            "feasible": True,
            "skip_ratio": ratio,
            "acceptance": first_token,
            "draft_ratio": draft_ratio,
            "max_tokens": best.max_tokens,
            "exit_threshold": best.exit_threshold,
            "tokens_per_step": best.tokens_per_step,
        }


# --- draft exit -----------------------------------------------------------------------


def exit_distributions(space: DraftExitSpace) -> dict:
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    return {
        "max_tokens": IntDistribution(*space.max_tokens),
        "exit_threshold": FloatDistribution(*space.exit_threshold),
        "adaptive": CategoricalDistribution(space.adaptive),
        "target_acceptance": FloatDistribution(*space.target_acceptance),
        "step": FloatDistribution(*space.step),
        "beta1": FloatDistribution(*space.beta1),
        "beta2": FloatDistribution(*space.beta2),
    }


def policy_from_params(params: dict) -> DraftExitPolicy:
    adaptive = (
        AdaptiveExit(params["target_acceptance"], params["step"], params["beta1"], params["beta2"])
        if params["adaptive"]
        else None
    )
    return DraftExitPolicy(int(params["max_tokens"]), float(params["exit_threshold"]), adaptive)


def params_from_policy(policy: DraftExitPolicy, space: DraftExitSpace) -> dict:
    rule = policy.adaptive or AdaptiveExit()

    def clip(value: float, bounds: tuple) -> float:
        return min(max(value, bounds[0]), bounds[1])

    return {
        "max_tokens": int(clip(policy.max_tokens, space.max_tokens)),
        "exit_threshold": clip(policy.exit_threshold, space.exit_threshold),
        "adaptive": policy.adaptive is not None,
        "target_acceptance": clip(rule.target_acceptance, space.target_acceptance),
        "step": clip(rule.step, space.step),
        "beta1": clip(rule.beta1, space.beta1),
        "beta2": clip(rule.beta2, space.beta2),
    }


@dataclass
class DraftExitObjective:
    """A trial: measured speedup of one draft-exit policy. Times wall clock, so trials
    must not share the machine's cores with each other."""

    target: TargetRef
    skip: SkipMask
    prompts: list[EncodedPrompt]
    max_new_tokens: int

    def __call__(self, config: dict) -> dict:
        policy = policy_from_params(config)
        measured = measure_lossless(
            self.target,
            lambda: LayerSkipDrafter(self.skip, policy),
            self.prompts,
            self.max_new_tokens,
            "speculative",
        )
        return {"objective": measured.speedup, **measured.summary()}
