"""EAGLE: a one-layer head extrapolates the target's features and drafts a token tree
from them, with a KV cache of its own. Tuned: a static tree from measured path
accuracies or EAGLE-2's dynamic expansion, sized for this device, and the draft
vocabulary."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from autotune.errors import AutotuneError
from autotune.methods.base import DraftEnv, Method, TuneContext
from autotune.methods.eagle.export import CANNOT, EXPORTERS
from autotune.methods.eagle.settings import EagleSettings
from autotune.methods.eagle.space import EagleSpace


class Eagle(Method):
    name = "eagle"
    title = "EAGLE head"
    summary = "a one-layer head extrapolates the target's features and drafts a token tree"
    settings_model: ClassVar = EagleSettings
    space_model: ClassVar = EagleSpace
    heads = "eagle"
    chain = True
    # the static tree study, then the dynamic (EAGLE-2) one
    time_shares: ClassVar = {"static tree study": 0.4, "dynamic tree study": 0.8}
    exporters: ClassVar = EXPORTERS
    cannot_export: ClassVar = CANNOT

    def check_heads(self, folder: Path) -> None:
        from autotune.heads.eagle import CONFIG, WEIGHTS

        if not (folder / CONFIG).is_file() or not any((folder / w).is_file() for w in WEIGHTS):
            raise AutotuneError(
                f"EAGLE head {folder}: needs {CONFIG} and "
                f"{' or '.join(WEIGHTS)}; train a head with "
                "`autotune heads train --kind eagle`"
            )

    def drafter(self, settings: EagleSettings, env: DraftEnv):
        return self._drafter(settings, env, settings.drafting_tree(), 0)

    def chain_drafter(
        self, settings: EagleSettings, env: DraftEnv, ranked_width: int, depth: int | None = None
    ):
        from autotune.drafters.eagle import StaticTree
        from autotune.engine.tree import chain_tree

        return self._drafter(settings, env, StaticTree(tuple(chain_tree(depth or 1))), ranked_width)

    def _drafter(self, settings: EagleSettings, env: DraftEnv, tree, ranked_width: int):
        from autotune.drafters.eagle import EagleDrafter
        from autotune.methods.eagle.trials import load_head_for, projection_for

        folder = env.resolve(settings.head)
        head = load_head_for(env.ref, folder)
        projection = projection_for(env.ref, folder, settings.draft_vocab)
        return lambda: EagleDrafter(head, tree, projection, ranked_width)

    def chain_models(self, settings: EagleSettings, ctx: TuneContext) -> list[Any]:
        from autotune.methods.eagle.chain import chain_models

        return chain_models(settings, ctx)

    def examples(self, model: Any, folder: Path) -> dict[str, EagleSettings]:
        import torch

        from autotune.heads.eagle import EagleHead, head_config, save_draft_vocab, save_eagle_head
        from autotune.methods.eagle.settings import DynamicEagleTree, StaticEagleTree

        head = EagleHead(head_config(model.config)).eval()
        hidden = model.config.hidden_size
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():  # near the identity on the feature, so its guesses are not all junk
            head.fc.weight.normal_(std=0.3 / hidden**0.5, generator=generator)
            head.fc.weight[:, hidden:] += torch.eye(hidden)
        saved = save_eagle_head(
            head, folder / "eagle", model.get_input_embeddings().weight, "example"
        )
        vocab = model.config.vocab_size
        save_draft_vocab(saved, {token: vocab - token for token in range(vocab)})
        static = StaticEagleTree(choices=[[0], [1], [0, 0], [0, 1], [0, 0, 0]])
        dynamic = DynamicEagleTree(total_tokens=8, depth=2, top_k=2)
        return {
            "static": EagleSettings(head=str(saved), tree=static),
            "dynamic": EagleSettings(head=str(saved), tree=dynamic),
            "draft_vocab": EagleSettings(
                head=str(saved), tree=static, draft_vocab=max(2, vocab // 2)
            ),
        }

    def problems(self, settings: EagleSettings, model: Any) -> list[str]:
        from autotune.methods.eagle.settings import StaticEagleTree

        vocab = model.vocab_size
        if settings.draft_vocab > vocab:
            return [
                f"draft_vocab: {settings.draft_vocab} tokens exceed the model's vocabulary "
                f"of {vocab}"
            ]
        # the head drafts from the draft vocabulary: its ranks and widths live there
        drafted = settings.draft_vocab or vocab
        what = "draft vocabulary" if settings.draft_vocab else "vocabulary"
        tree = settings.tree
        if isinstance(tree, StaticEagleTree):
            widest = max(max(path) for path in tree.choices)
            if widest >= drafted:
                return [
                    f"tree.choices: rank {widest} needs a top-{widest + 1} token, but the "
                    f"{what} has {drafted} tokens"
                ]
        elif tree.top_k > drafted:
            return [f"tree.top_k: {tree.top_k} exceeds the {what} of {drafted} tokens"]
        return []


ENTRY = Eagle()
