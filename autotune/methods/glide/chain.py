"""The GLIDE draft drafting a chain, as CAPE's fit replays it: one chain model per draft
length, each with the tuned exit threshold and draft vocabulary."""

from __future__ import annotations

from autotune.drafters.self_spec import DraftExitPolicy
from autotune.measure.glide_accuracy import measure_step_seconds
from autotune.methods.base import TuneContext
from autotune.methods.glide.settings import GlideSettings
from autotune.methods.glide.space import GlideSpace
from autotune.methods.glide.trials import load_draft_for, projection_for, vocab_sizes
from autotune.methods.glide.tune import calibration_chains
from autotune.methods.heads import confirm_and_calibration, unseen_search_prompts
from autotune.tuners.cape_fit import ChainModel, SelfSpecChain


def chain_models(settings: GlideSettings, ctx: TuneContext) -> list[ChainModel]:
    """Draft lengths 1 .. CAPE's max_chain_depth (and the tuned one), replayed on the GLIDE
    search's calibration continuations (cached), with the tuned exit threshold."""
    ws, glide_space = ctx.workspace, ctx.base_space
    assert isinstance(glide_space, GlideSpace)
    head_dir = str(ctx.heads)
    search = ws.encode(unseen_search_prompts(ws, head_dir))
    _, rest = confirm_and_calibration(search, glide_space.trials.prompts)
    calibration = ws.continuations(
        rest[: glide_space.calibration.prompts], glide_space.calibration.tokens
    )
    # the vocabularies the GLIDE search measured together: its cached chains are reused
    vocabs = sorted(
        set(vocab_sizes(head_dir, glide_space.calibration.draft_vocab)) | {settings.draft_vocab}
    )
    deepest = max(glide_space.calibration.max_depth, settings.draft.max_tokens)
    chains = calibration_chains(ctx, head_dir, calibration, deepest, vocabs)[settings.draft_vocab]
    seconds = measure_step_seconds(
        ws.runner,
        load_draft_for(ws.ref, head_dir),
        projection_for(ws.ref, head_dir, settings.draft_vocab),
    )
    threshold = settings.draft.exit_threshold
    shortest_first = range(1, min(ctx.space.max_chain_depth, deepest) + 1)
    lengths = sorted({*shortest_first, settings.draft.max_tokens})
    return [
        ChainModel(
            f"draft length {length}, exit {threshold:g}",
            SelfSpecChain(DraftExitPolicy(length, threshold, None), seconds),
            chains,
            chain_depth=length,
            info={"calibration_prompts": len(calibration), "exit_threshold": threshold},
        )
        for length in lengths
    ]
