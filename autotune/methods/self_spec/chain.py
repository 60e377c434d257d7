"""The layer-skip chain as CAPE's fit replays it."""

from __future__ import annotations

from autotune.measure.cape_stats import self_spec_chain_steps
from autotune.measure.draft_trace import DraftTracer
from autotune.methods.base import TuneContext
from autotune.methods.self_spec.settings import SelfSpecSettings
from autotune.progress import step
from autotune.tuners.cape_fit import ChainModel, SelfSpecChain


def chain_models(settings: SelfSpecSettings, ctx: TuneContext) -> list[ChainModel]:
    """One model: the tuned mask's chain with its own exit rule, from teacher-forced
    traces of calibration decoding on search prompts."""
    ws, space = ctx.workspace, ctx.space
    search = ws.encode(ws.search_prompts())
    calibration = ws.continuations(search[: space.calibration.prompts], space.calibration.tokens)
    skip, policy = settings.skip_mask(), settings.exit_policy()
    with step("cape: draft confidences along greedy decoding", 1) as advance:
        traces = DraftTracer(ws.runner, calibration).traces(skip)
        advance()
    verify = ws.verify_curve(space.max_verify_tokens)
    _, costs = ws.device_costs()
    rule = SelfSpecChain(policy, costs.draft_ratio(skip) * verify(1))
    steps = [self_spec_chain_steps(t, policy.max_tokens) for t in traces]
    return [
        ChainModel(
            "its draft-exit rule", rule, steps, info={"calibration_prompts": len(calibration)}
        )
    ]
