"""GLIDE: a small decoder whose layers cross-attend to the target's KV cache (as it stands
before the bonus token) drafts a chain. Tuned: the draft length, the exit threshold and
the draft vocabulary; CAPE's confidence bins for it through the CAPE expansion."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from autotune.errors import AutotuneError
from autotune.methods.base import DraftEnv, Method, TuneContext
from autotune.methods.glide.export import CANNOT, EXPORTERS
from autotune.methods.glide.settings import GlideDraftExit, GlideSettings
from autotune.methods.glide.space import GlideSpace


class Glide(Method):
    name = "glide"
    title = "GLIDE draft"
    summary = "a small decoder that reads the target's KV cache drafts a chain"
    settings_model: ClassVar = GlideSettings
    space_model: ClassVar = GlideSpace
    heads = "glide"
    chain = True
    time_shares: ClassVar = {"study": 0.9}
    exporters: ClassVar = EXPORTERS
    cannot_export: ClassVar = CANNOT

    def check_heads(self, folder: Path) -> None:
        from autotune.heads.glide import CONFIG, TRAIN_COMMAND, WEIGHTS, is_glide_folder

        if not is_glide_folder(folder):
            raise AutotuneError(
                f"GLIDE draft {folder}: needs {CONFIG} and {' or '.join(WEIGHTS)}; train "
                f"a draft with {TRAIN_COMMAND}"
            )

    def drafter(self, settings: GlideSettings, env: DraftEnv):
        return self._drafter(settings, env, None, 0)

    def chain_drafter(
        self, settings: GlideSettings, env: DraftEnv, ranked_width: int, depth: int | None = None
    ):
        return self._drafter(settings, env, depth, ranked_width)

    def _drafter(self, settings: GlideSettings, env: DraftEnv, depth, ranked_width: int):
        from autotune.drafters.glide import GlideDrafter
        from autotune.methods.glide.trials import load_draft_for, projection_for

        folder = env.resolve(settings.head)
        draft = load_draft_for(env.ref, folder)
        projection = projection_for(env.ref, folder, settings.draft_vocab)
        policy = settings.exit_policy(depth)
        return lambda: GlideDrafter(draft, policy, projection, ranked_width)

    def chain_models(self, settings: GlideSettings, ctx: TuneContext) -> list[Any]:
        from autotune.methods.glide.chain import chain_models

        return chain_models(settings, ctx)

    def examples(self, model: Any, folder: Path) -> dict[str, GlideSettings]:
        """Drafts built from the model's own (random) weights, as ``heads train`` warm-starts
        them: their drafts are often right on a tiny model's looping output, so the
        contract's accepted paths are exercised."""
        from autotune.heads.eagle import save_draft_vocab
        from autotune.heads.glide import save_glide_draft
        from autotune.training.glide import new_draft

        saved = {}
        for layers in (1, 2):
            draft = new_draft(model, layers, "target").eval()
            saved[layers] = save_glide_draft(draft, folder / f"glide-{layers}", "example")
        vocab = model.config.vocab_size
        save_draft_vocab(saved[1], {token: vocab - token for token in range(vocab)})
        return {
            "one_layer": GlideSettings(
                head=str(saved[1]), draft=GlideDraftExit(max_tokens=4, exit_threshold=0.0)
            ),
            "two_layers_exit": GlideSettings(
                head=str(saved[2]), draft=GlideDraftExit(max_tokens=6, exit_threshold=0.3)
            ),
            "draft_vocab": GlideSettings(
                head=str(saved[1]),
                draft=GlideDraftExit(max_tokens=3, exit_threshold=0.0),
                draft_vocab=max(2, vocab // 2),
            ),
        }

    def problems(self, settings: GlideSettings, model: Any) -> list[str]:
        if settings.draft_vocab > model.vocab_size:
            return [
                f"draft_vocab: {settings.draft_vocab} tokens exceed the model's vocabulary "
                f"of {model.vocab_size}"
            ]
        return []


ENTRY = Glide()
