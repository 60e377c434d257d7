"""Medusa heads: the module, and the upstream checkpoint layout.

Layout (FasterDecoding/Medusa): a folder with ``config.json`` (``medusa_num_heads``,
``medusa_num_layers``, ``base_model_name_or_path``) and ``medusa_lm_head.safetensors``
or ``medusa_lm_head.pt``, the state dict of a ModuleList whose entry k is
``Sequential(ResBlock x medusa_num_layers, Linear(hidden, vocab, bias=False))``.
Head k predicts the token k + 2 positions after the hidden state it reads (the base
model's own head predicts the token right after it).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import cast

import torch
from torch import nn

from autotune.engine import layers
from autotune.errors import AutotuneError
from autotune.files import atomic_path, write_atomic
from autotune.heads.cache import loading_heads

CONFIG = "config.json"
WEIGHTS = ("medusa_lm_head.safetensors", "medusa_lm_head.pt")


class HeadsError(AutotuneError):
    pass


class ResBlock(nn.Module):
    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)  # starts as the identity, as upstream does
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(layers.linear(x, self.linear))


class MedusaHeads(nn.Module):
    def __init__(self, hidden_size: int, vocab_size: int, num_heads: int, num_layers: int = 1):
        super().__init__()
        self.hidden_size, self.vocab_size = hidden_size, vocab_size
        self.num_layers = num_layers
        self.heads = nn.ModuleList(
            nn.Sequential(
                *(ResBlock(hidden_size) for _ in range(num_layers)),
                nn.Linear(hidden_size, vocab_size, bias=False),
            )
            for _ in range(num_heads)
        )

    @property
    def num_heads(self) -> int:
        return len(self.heads)

    def projection(self, k: int) -> nn.Linear:
        """Head k's vocabulary projection."""
        return cast(nn.Linear, cast(nn.Sequential, self.heads[k])[-1])

    def blocks(self, k: int) -> nn.Sequential:
        """Head k's residual blocks."""
        return cast(nn.Sequential, cast(nn.Sequential, self.heads[k])[:-1])

    def vocab_weights(self) -> list[torch.Tensor]:
        return [self.projection(k).weight for k in range(self.num_heads)]

    def share_vocab_projection(self, weight: torch.Tensor) -> None:
        """Point every head's vocabulary projection at ``weight`` (the target's lm_head):
        heads trained with a frozen copy of it then cost one matrix product together."""
        for k in range(self.num_heads):
            self.projection(k).weight = cast(nn.Parameter, weight)

    @property
    def shares_vocab_projection(self) -> bool:
        weights = self.vocab_weights()
        return all(w is weights[0] for w in weights)

    def features(self, hidden: torch.Tensor, count: int | None = None) -> torch.Tensor:
        """[count, ..., H]: each head's input to its vocabulary projection."""
        count = self.num_heads if count is None else count
        return torch.stack([self.blocks(k)(hidden) for k in range(count)])

    def forward(self, hidden: torch.Tensor, count: int | None = None) -> torch.Tensor:
        """Logits [count, ..., V] of the first ``count`` heads for ``hidden`` [..., H]
        (the target's last hidden state, after its final norm)."""
        feats = self.features(hidden, count)
        if self.shares_vocab_projection:
            return layers.linear(feats, self.projection(0))
        return torch.stack([layers.linear(f, self.projection(k)) for k, f in enumerate(feats)])


def save_medusa_heads(
    heads: MedusaHeads, folder: str | Path, base_model: str, extra: dict | None = None
) -> Path:
    """Write the upstream layout (safetensors; every head gets its own projection tensor,
    as the format requires, even when they are shared in memory)."""
    state = {
        f"{k}.{key}": value
        for k, head in enumerate(heads.heads)
        for key, value in head.state_dict().items()
    }
    config = {
        "medusa_num_heads": heads.num_heads,
        "medusa_num_layers": heads.num_layers,
        "base_model_name_or_path": base_model,
        "hidden_size": heads.hidden_size,
        "vocab_size": heads.vocab_size,
        **(extra or {}),
    }
    return write_heads_folder(folder, WEIGHTS[0], state, config)


def write_heads_folder(
    folder: str | Path, weights: str, state: dict[str, torch.Tensor], config: dict
) -> Path:
    """Write ``state`` to the safetensors file ``weights`` in ``folder`` (copies of the
    tensors: shared or strided ones cannot be saved as they are) and ``config`` to its
    config.json, each whole or not at all; returns the folder."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {key: value.detach().contiguous().clone() for key, value in state.items()}
    with atomic_path(folder / weights) as temp:
        save_file(tensors, str(temp))
    write_atomic(folder / CONFIG, json.dumps(config, indent=2, default=str) + "\n")
    return folder


_PROJECTION = re.compile(r"^(\d+)\.(\d+)\.weight$")


def read_weights(
    folder: Path, names: tuple[str, ...], kind: str, missing: str
) -> dict[str, torch.Tensor]:
    """The state dict in the first of ``names`` present in ``folder`` (safetensors or a
    torch pickle), or a HeadsError naming the file; ``missing`` says what to do when
    there is none."""
    for name in names:
        path = folder / name
        if not path.is_file():
            continue
        try:
            if name.endswith(".safetensors"):
                from safetensors.torch import load_file

                return load_file(str(path))
            return torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # a truncated or foreign file: say which one
            raise HeadsError(f"cannot read {kind} weights {path}: {exc}") from None
    raise HeadsError(f"no {' or '.join(names)} in {folder}: {missing}")


def _read_state(folder: Path) -> dict[str, torch.Tensor]:
    return read_weights(
        folder,
        WEIGHTS,
        "Medusa",
        "pass a Medusa head folder (config.json + medusa_lm_head.*), or "
        "train one with `autotune heads train --kind medusa`",
    )


def load_medusa_heads(
    folder: str | Path,
    lm_head: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> MedusaHeads:
    """Load heads in the upstream layout. The head count and depth come from the weights,
    not from config.json: published configs misstate them. With ``lm_head`` given, heads
    whose projection equals it share it."""
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise HeadsError(f"Medusa head folder {folder} not found")
    with loading_heads(folder, "medusa"):
        state = _read_state(folder)
        state = {re.sub(r"^(medusa_head\.|module\.)+", "", k): v for k, v in state.items()}
        count, num_layers, (vocab, hidden) = _heads_shape(folder, state)
        heads = MedusaHeads(hidden, vocab, count, num_layers)
        expected = {f"{k}.{key}" for k, head in enumerate(heads.heads) for key in head.state_dict()}
        missing = expected - state.keys()
        if missing:
            raise HeadsError(f"{folder}: weights missing for {sorted(missing)[:4]}")
        heads.heads.load_state_dict({k: state[k] for k in expected})
        heads.to(dtype=dtype, device=device).eval().requires_grad_(False)
        if lm_head is not None and all(
            w.shape == lm_head.shape and torch.equal(w, lm_head.to(w.dtype))
            for w in heads.vocab_weights()
        ):
            heads.share_vocab_projection(lm_head)
        declared = _declared_heads(folder)
        if declared is not None and declared != count:
            from autotune.progress import say

            say(
                f"[yellow]{folder}/config.json says {declared} heads; the weights hold "
                f"{count}: using {count}[/yellow]"
            )
        return heads


def _heads_shape(folder: Path, state: dict[str, torch.Tensor]) -> tuple[int, int, torch.Size]:
    """(heads, residual blocks per head, the projection's [vocab, hidden] shape) that the
    weights hold; a HeadsError where they are not a Medusa heads' state."""
    projections: dict[int, tuple[int, torch.Tensor]] = {}
    for key, value in state.items():
        if m := _PROJECTION.match(key):
            projections[int(m[1])] = (int(m[2]), value)
    if not projections:
        raise HeadsError(
            f"{folder}: no Medusa head weights found (expected keys like "
            "'0.0.linear.weight' and '0.1.weight')"
        )
    count = max(projections) + 1
    if sorted(projections) != list(range(count)):
        raise HeadsError(f"{folder}: heads {sorted(projections)} are not numbered 0..{count - 1}")
    layers = {index for index, _ in projections.values()}
    if len(layers) != 1:
        raise HeadsError(f"{folder}: heads have different numbers of residual blocks")
    return count, layers.pop(), projections[0][1].shape


def _declared_heads(folder: Path) -> int | None:
    try:
        return int(json.loads((folder / CONFIG).read_text())["medusa_num_heads"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
