"""`autotune bench`: measure a profile's methods again, on prompts of the user's choice."""
from __future__ import annotations

from pathlib import Path

from autotune.drafters.self_spec import AdaptiveExit, DraftExitPolicy, LayerSkipDrafter
from autotune.engine.skip import SkipMask
from autotune.measure.timing import measure_with_progress
from autotune.profile.io import read_profile
from autotune.progress import say
from autotune.prompts import split_prompts
from autotune.models.ref import TargetRef
from autotune.workspace import Workspace


def self_spec_drafter(block, ws: Workspace) -> callable:
    skip = SkipMask.of(block.skip.attention, block.skip.mlp)
    rule = block.draft.adaptive
    policy = DraftExitPolicy(block.draft.max_tokens, block.draft.exit_threshold,
                             None if rule is None else AdaptiveExit(**rule.model_dump()))
    return lambda: LayerSkipDrafter(skip, policy)


def medusa_drafter(block, ws: Workspace) -> callable:
    from autotune.drafters.medusa import MedusaDrafter
    from autotune.tuners.medusa import load_heads_for

    heads = load_heads_for(ws.ref, block.heads)
    tree = [tuple(p) for p in block.tree]
    return lambda: MedusaDrafter(heads, tree)


def eagle_drafter(block, ws: Workspace, chain_depth: int | None = None) -> callable:
    """The profile's tree, or a chain of ``chain_depth`` (what CAPE expands)."""
    from autotune.drafters.eagle import EagleDrafter, StaticTree
    from autotune.tuners.eagle import load_head_for, projection_for, tree_from_settings
    from autotune.engine.tree import chain_tree

    head = load_head_for(ws.ref, block.head)
    tree = tree_from_settings(block.tree.model_dump()) if chain_depth is None else \
        StaticTree(tuple(chain_tree(chain_depth)))
    projection = projection_for(ws.ref, block.head, block.draft_vocab)
    return lambda: EagleDrafter(head, tree, projection)


DRAFTERS = {"self_spec": self_spec_drafter, "medusa": medusa_drafter, "eagle": eagle_drafter}


def cape_drafter(name: str, block, ws: Workspace, policy=None) -> callable:
    """The method's chain drafter with CAPE expansion: the profile's fitted policy, or
    ``policy``."""
    from autotune.drafters.cape import CapeDrafter
    from autotune.tuners.cape import policy_from_block

    policy = policy or policy_from_block(block.cape)
    base = eagle_drafter(block, ws, block.cape.chain_depth or 1) if name == "eagle" \
        else DRAFTERS[name](block, ws)
    return lambda: CapeDrafter(base(), policy)


def bench_profile(path: Path, prompts: str | None, max_new_tokens: int,
                  model_path: str | None = None) -> dict:
    profile = read_profile(Path(path))
    ref = TargetRef.for_user(profile.model.name, model_path or profile.model.path)
    ws = Workspace.open(ref, prompts or profile.workload.prompts, storage=None,
                        need_storage=False)
    if ws.target.fingerprint != profile.model.fingerprint:
        say(f"[yellow]warning: model fingerprint {ws.target.fingerprint} differs from the "
            f"profile's {profile.model.fingerprint}[/yellow]")
    chosen = ws.prompts if prompts else split_prompts(ws.prompts)[1]
    encoded = ws.encode(chosen)
    results = {}
    for name, block in profile.methods:
        if block is None:
            continue
        measured = measure_with_progress(f"bench {name}", ws.runner, DRAFTERS[name](block, ws),
                                         encoded, max_new_tokens)
        results[name] = {**measured.summary(), "per_prompt": measured.per_prompt()}
        if getattr(block, "cape", None) is not None:
            measured = measure_with_progress(f"bench {name}+cape", ws.runner,
                                             cape_drafter(name, block, ws), encoded,
                                             max_new_tokens)
            results[f"{name}+cape"] = {**measured.summary(), "per_prompt": measured.per_prompt()}
    return results
