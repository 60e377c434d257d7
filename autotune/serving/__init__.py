"""Serving engines run as a user deploys them, so that an export is measured where it will
serve: llama.cpp's ``llama-server`` (built here from a source package) and transformers'
``generate``. Each decodes a prompt greedily with a given speculative setting and reports
the tokens, the seconds they took and what was drafted."""

from __future__ import annotations

from dataclasses import dataclass

from autotune.measure.timing import EncodedPrompt, PromptMeasurement


@dataclass(frozen=True)
class Decoded:
    """One greedy decoding in a serving engine."""

    tokens: list[int]  # the new tokens
    seconds: float  # generating them (the prompt's prefill left out where the engine says)
    drafted: int = 0  # draft tokens proposed
    accepted: int = 0  # of which the target kept


def paired(prompt: EncodedPrompt, greedy: Decoded, done: Decoded) -> PromptMeasurement:
    """One prompt decoded by the engine greedily and with a speculative setting."""
    return PromptMeasurement(
        prompt_id=prompt.id,
        baseline_tokens=len(greedy.tokens),
        baseline_seconds=greedy.seconds,
        method_tokens=len(done.tokens),
        method_seconds=done.seconds,
        # each step yields its accepted tokens and one of the target's own
        steps=max(len(done.tokens) - 1 - done.accepted, 1),
        drafted=done.drafted,
        accepted=done.accepted,
        lossless=done.tokens == greedy.tokens,
        category=prompt.category,
    )
