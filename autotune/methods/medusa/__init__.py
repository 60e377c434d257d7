"""Medusa: K extra heads read the target's last hidden state and guess the tokens 2..K+1
ahead; their top-k guesses fill a token tree verified in one forward. Tuned: the tree
(which ranks at which depth), its size for this device, the head count, and typical
acceptance for sampling."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, cast

from autotune.errors import AutotuneError
from autotune.methods.base import DraftEnv, Method
from autotune.methods.medusa.export import CANNOT, EXPORTERS
from autotune.methods.medusa.settings import MedusaSettings
from autotune.methods.medusa.space import MedusaSpace


class Medusa(Method):
    name = "medusa"
    title = "Medusa heads"
    summary = "extra heads on the target's last hidden state fill a token tree"
    settings_model: ClassVar = MedusaSettings
    space_model: ClassVar = MedusaSpace
    heads = "medusa"
    time_shares: ClassVar = {"tree study": 0.85}  # the rest: typical acceptance
    exporters: ClassVar = EXPORTERS
    cannot_export: ClassVar = CANNOT

    def check_heads(self, folder: Path) -> None:
        if not folder.is_dir() or not any(folder.glob("medusa_lm_head.*")):
            raise AutotuneError(
                f"Medusa heads {folder}: no medusa_lm_head.safetensors or .pt "
                "there; train heads with `autotune heads train --kind medusa`"
            )

    def drafter(self, settings: MedusaSettings, env: DraftEnv):
        from autotune.drafters.medusa import MedusaDrafter
        from autotune.methods.medusa.trials import load_heads_for

        heads = load_heads_for(env.ref, env.resolve(settings.heads))
        tree = settings.choices()
        return lambda: MedusaDrafter(heads, tree)

    def examples(self, model: Any, folder: Path) -> dict[str, MedusaSettings]:
        import torch

        from autotune.heads.medusa import MedusaHeads, ResBlock, save_medusa_heads

        config = model.config
        heads = MedusaHeads(config.hidden_size, config.vocab_size, num_heads=3)
        # on the heads' device, wherever torch's default device put them
        generator = torch.Generator(next(heads.parameters()).device).manual_seed(0)
        with torch.no_grad():
            for k in range(heads.num_heads):
                for block in heads.blocks(k):
                    cast(ResBlock, block).linear.weight.normal_(std=0.2, generator=generator)
        heads.share_vocab_projection(model.lm_head.weight)
        saved = save_medusa_heads(heads, folder / "medusa", "example")
        tree = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]
        return {
            "tree": MedusaSettings(heads=str(saved), num_heads=3, tree=tree),
            "chain": MedusaSettings(heads=str(saved), num_heads=2, tree=[[0], [0, 0]]),
        }

    def problems(self, settings: MedusaSettings, model: Any) -> list[str]:
        # depth within num_heads is the schema's check; a rank is a place in the vocabulary
        widest = max(max(path) for path in settings.tree)
        if widest >= model.vocab_size:
            return [
                f"tree: rank {widest} needs a top-{widest + 1} token, but the model's "
                f"vocabulary has {model.vocab_size} tokens"
            ]
        return []


ENTRY = Medusa()
