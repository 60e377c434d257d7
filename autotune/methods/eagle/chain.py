"""The EAGLE head drafting a chain, as CAPE's fit replays it: one chain model per depth."""

from __future__ import annotations

from autotune.measure.cape_stats import ChainSteps, eagle_chain_steps
from autotune.measure.eagle_accuracy import measure_level_costs
from autotune.methods.base import TuneContext
from autotune.methods.eagle.settings import EagleSettings
from autotune.methods.eagle.trials import load_head_for, projection_for
from autotune.methods.eagle.tune import chain_seconds
from autotune.methods.heads import confirm_and_calibration, unseen_search_prompts
from autotune.progress import step
from autotune.tuners.cape_fit import ChainModel, FixedChain


def chain_models(settings: EagleSettings, ctx: TuneContext) -> list[ChainModel]:
    """Chains of depth 1 .. max_chain_depth, from the head's own extrapolation along the
    EAGLE search's calibration continuations (cached), with its draft vocabulary."""
    ws, space, eagle_space = ctx.workspace, ctx.space, ctx.base_space
    head_dir = str(ctx.heads)
    head = load_head_for(ws.ref, head_dir)
    projection = projection_for(ws.ref, head_dir, settings.draft_vocab)
    search = ws.encode(unseen_search_prompts(ws, head_dir))
    _, rest = confirm_and_calibration(search, eagle_space.trials.prompts)
    calibration = ws.continuations(
        rest[: eagle_space.calibration.prompts], eagle_space.calibration.tokens
    )
    deepest = space.max_chain_depth
    with step("cape: eagle head confidences along greedy decoding", len(calibration)) as advance:
        chains = eagle_chain_steps(ws.runner, head, calibration, deepest, projection, advance)
    costs = measure_level_costs(ws.runner, head, projection=projection)
    return [
        ChainModel(
            f"chain depth {depth}",
            FixedChain(depth, chain_seconds(depth, costs)),
            [ChainSteps(c.confidences[:, :depth], c.ranks[:, :depth]) for c in chains],
            chain_depth=depth,
            info={"calibration_prompts": len(calibration)},
        )
        for depth in range(1, deepest + 1)
    ]
