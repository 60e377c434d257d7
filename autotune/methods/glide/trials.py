"""The GLIDE study's trials (run by Ray Tune workers): the draft and its draft
vocabularies loaded once per process, the setting a trial's parameters name, real
decoding."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from autotune.drafters.glide import GlideDrafter
from autotune.drafters.self_spec import DraftExitPolicy
from autotune.heads.eagle import DraftProjection, load_draft_vocab
from autotune.heads.glide import GlideDraft
from autotune.measure.timing import EncodedPrompt
from autotune.methods.trial import measure_lossless
from autotune.models.ref import TargetRef
from autotune.process_cache import cached


def load_draft_for(target: TargetRef, folder: str | Path) -> GlideDraft:
    """The draft on the target's device and dtype; loaded once per process."""
    from autotune.heads.glide import load_glide_draft

    def build() -> GlideDraft:
        runner = target.runner()
        return load_glide_draft(folder, runner.config, runner.dtype, runner.device)

    return cached(("glide_draft", target, str(Path(folder).resolve())), build)


def vocab_sizes(folder: str | Path, wanted: list[int]) -> list[int]:
    """The draft-vocabulary sizes that apply to this draft (0 = the whole vocabulary):
    sizes past the folder's ranked token list are clipped to it; none without one."""
    ranked = load_draft_vocab(folder)
    if not ranked:
        return [0]
    return sorted({0 if size == 0 else min(size, len(ranked)) for size in wanted} | {0})


def projection_for(target: TargetRef, folder: str | Path, size: int) -> DraftProjection:
    """The draft's lm_head over the folder's ``size`` most frequent tokens (0: all)."""

    def build() -> DraftProjection:
        _, lm_head = load_draft_for(target, folder).vocabulary(target.runner())
        ranked = load_draft_vocab(folder) if size else None
        return DraftProjection(lm_head, ranked[:size] if ranked else None)

    return cached(("glide_projection", target, str(Path(folder).resolve()), size), build)


def policy_of(params: dict) -> DraftExitPolicy:
    return DraftExitPolicy(int(params["max_tokens"]), float(params["exit_threshold"]), None)


@dataclass
class GlideObjective:
    """A trial: measured speedup of one (draft length, exit threshold, draft vocabulary).
    Times wall clock, so trials must not share the machine's cores."""

    target: TargetRef
    head_dir: str
    prompts: list[EncodedPrompt]
    max_new_tokens: int

    def __call__(self, config: dict) -> dict:
        draft = load_draft_for(self.target, self.head_dir)
        projection = projection_for(self.target, self.head_dir, int(config["vocab"]))
        policy = policy_of(config)
        measured = measure_lossless(
            self.target,
            lambda: GlideDrafter(draft, policy, projection),
            self.prompts,
            self.max_new_tokens,
            "GLIDE",
        )
        return {"objective": measured.speedup, **measured.summary()}
