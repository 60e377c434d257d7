"""`autotune bench`: measure a profile's methods again, on prompts of the user's choice."""

from __future__ import annotations

from pathlib import Path

from autotune.measure.timing import measure_variants
from autotune.methods import registry
from autotune.methods.base import DraftEnv
from autotune.models.ref import TargetRef
from autotune.profile.io import read_profile
from autotune.progress import say, step
from autotune.workspace import Workspace


def bench_profile(
    path: Path, prompts: str | None, max_new_tokens: int, model_path: str | None = None
) -> dict:
    """Every method of the profile (as deployed: with CAPE where it is enabled) against one
    plain greedy decoding per prompt, interleaved; keyed by method."""
    profile = read_profile(Path(path))
    ref = TargetRef.for_user(profile.model.name, model_path or profile.model.path)
    ws = Workspace.open(ref, prompts or profile.workload.prompts, storage=None, need_storage=False)
    if ws.target.fingerprint != profile.model.fingerprint:
        say(
            f"[yellow]warning: model fingerprint {ws.target.fingerprint} differs from the "
            f"profile's {profile.model.fingerprint}[/yellow]"
        )
    chosen = ws.prompts if prompts else ws.heldback_prompts()
    encoded = ws.encode(chosen)
    env = DraftEnv(ws.ref, ws.runner, Path(path).resolve().parent)
    makers = {
        name: registry.method(name).variant(block, env)
        for name, block in profile.method_blocks().items()
    }
    with step("bench: every method against plain greedy", len(encoded) * len(makers)) as advance:
        measured = measure_variants(
            ws.runner, makers, encoded, max_new_tokens, on_prompt=lambda _: advance()
        )
    return {name: {**m.summary(), "per_prompt": m.per_prompt()} for name, m in measured.items()}
