"""Turning logits into the distribution a decoder draws from."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingConfig:
    """temperature 0 means greedy decoding."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


GREEDY = SamplingConfig()


def probabilities(logits: torch.Tensor, config: SamplingConfig) -> torch.Tensor:
    """Temperature- and top-p-processed probabilities over the last dimension."""
    probs = torch.softmax(logits.float() / config.temperature, dim=-1)
    if config.top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # keep the smallest prefix whose mass reaches top_p (the top token always stays)
        drop = sorted_probs.cumsum(dim=-1) - sorted_probs >= config.top_p
        drop[..., 0] = False
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def most_probable(probs: torch.Tensor) -> tuple[float, int]:
    """The most probable index of ``probs`` [V] and its probability, read back to the
    host in one transfer: on a GPU each read waits for the device, and a drafter asks
    for both at every draft token. (The index travels as a float32: exact up to 2**24,
    past any vocabulary.)"""
    top = probs.max(dim=-1)
    confidence, index = torch.stack([top.values.float(), top.indices.float()]).tolist()
    return confidence, int(index)


def sample(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One token drawn from ``probs`` [V] by ``generator``, on the generator's device (the
    CPU's: the same seed then draws the same tokens whichever device the model is on)."""
    return int(torch.multinomial(probs.to(generator.device), 1, generator=generator))
