"""The adaptive draft-exit rule for a chosen mask, tuned on measured speedup."""
from __future__ import annotations

from dataclasses import dataclass

from autotune.drafters.self_spec import AdaptiveExit, DraftExitPolicy, LayerSkipDrafter
from autotune.engine.skip import SkipMask
from autotune.models.ref import TargetRef
from autotune.tuners.space import DraftExitSpace


def search_distributions(space: DraftExitSpace) -> dict:
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
    adaptive = AdaptiveExit(params["target_acceptance"], params["step"], params["beta1"],
                            params["beta2"]) if params["adaptive"] else None
    return DraftExitPolicy(int(params["max_tokens"]), float(params["exit_threshold"]), adaptive)


def params_from_policy(policy: DraftExitPolicy, space: DraftExitSpace) -> dict:
    rule = policy.adaptive or AdaptiveExit()
    clip = lambda v, bounds: min(max(v, bounds[0]), bounds[1])  # noqa: E731
    return {"max_tokens": int(clip(policy.max_tokens, space.max_tokens)),
            "exit_threshold": clip(policy.exit_threshold, space.exit_threshold),
            "adaptive": policy.adaptive is not None,
            "target_acceptance": clip(rule.target_acceptance, space.target_acceptance),
            "step": clip(rule.step, space.step), "beta1": clip(rule.beta1, space.beta1),
            "beta2": clip(rule.beta2, space.beta2)}


@dataclass
class DraftExitObjective:
    """A Ray Tune trial: measured speedup of one draft-exit policy. Times wall-clock, so
    trials must not share the machine's cores with each other."""

    target: TargetRef
    skip: SkipMask
    prompts: list[tuple[str, list[int]]]
    max_new_tokens: int

    def __call__(self, config: dict) -> dict:
        from autotune.measure.timing import measure_side_by_side

        policy = policy_from_params(config)
        measured = measure_side_by_side(self.target.runner(),
                                        lambda: LayerSkipDrafter(self.skip, policy),
                                        self.prompts, self.max_new_tokens)
        if measured.lossless is False:
            raise RuntimeError("speculative output differed from plain greedy output")
        return {"objective": measured.speedup, **measured.summary()}
