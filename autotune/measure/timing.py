"""Side-by-side wall-clock measurement of a method against plain greedy decoding.

Both run in this process on the same prompts, interleaved prompt by prompt (the order
alternates so that neither always runs on a warmer cache), after a warm-up.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from autotune.engine.decoding import DecodeResult, decode_plain, decode_speculative, tokens_per_step
from autotune.engine.proposal import Drafter
from autotune.engine.runner import Runner
from autotune.engine.sampling import GREEDY, SamplingConfig

WARMUP_TOKENS = 8


@dataclass
class PromptMeasurement:
    prompt_id: str
    baseline_tokens: int
    baseline_seconds: float
    method_tokens: int
    method_seconds: float
    steps: int  # the method's target forwards after the prefill
    drafted: int
    accepted: int
    lossless: bool | None  # None when sampling: outputs are not expected to match


@dataclass
class Measurement:
    prompts: list[PromptMeasurement] = field(default_factory=list)

    def _total(self, name: str) -> float:
        return sum(getattr(p, name) for p in self.prompts)

    @property
    def tokens_per_s(self) -> float:
        return self._total("method_tokens") / max(self._total("method_seconds"), 1e-9)

    @property
    def baseline_tokens_per_s(self) -> float:
        return self._total("baseline_tokens") / max(self._total("baseline_seconds"), 1e-9)

    @property
    def speedup(self) -> float:
        return self.tokens_per_s / max(self.baseline_tokens_per_s, 1e-9)

    @property
    def tokens_per_step(self) -> float:
        return tokens_per_step(
            int(self._total("method_tokens")), int(self._total("steps")), len(self.prompts)
        )

    @property
    def acceptance_rate(self) -> float:
        return self._total("accepted") / max(self._total("drafted"), 1)

    @property
    def lossless(self) -> bool | None:
        flags = [p.lossless for p in self.prompts if p.lossless is not None]
        return all(flags) if flags else None

    def summary(self) -> dict:
        return {
            "speedup": round(self.speedup, 4),
            "tokens_per_step": round(self.tokens_per_step, 4),
            "acceptance_rate": round(self.acceptance_rate, 4),
            "tokens_per_s": round(self.tokens_per_s, 3),
            "baseline_tokens_per_s": round(self.baseline_tokens_per_s, 3),
            "lossless": self.lossless,
            "prompts": len(self.prompts),
        }

    def per_prompt(self) -> list[dict]:
        return [
            {
                "prompt": p.prompt_id,
                "tokens_per_s": round(p.method_tokens / max(p.method_seconds, 1e-9), 3),
                "baseline_tokens_per_s": round(
                    p.baseline_tokens / max(p.baseline_seconds, 1e-9), 3
                ),
                "tokens_per_step": round(tokens_per_step(p.method_tokens, p.steps), 3),
                "acceptance_rate": round(p.accepted / max(p.drafted, 1), 3),
                "lossless": p.lossless,
            }
            for p in self.prompts
        ]


def measure_with_progress(
    label: str,
    runner: Runner,
    make_drafter: Callable[[], Drafter],
    prompts: list[tuple[str, list[int]]],
    max_new_tokens: int,
    sampling: SamplingConfig = GREEDY,
) -> Measurement:
    """``measure_side_by_side`` with a progress bar, one step a prompt."""
    from autotune.progress import step

    with step(label, len(prompts)) as advance:
        return measure_side_by_side(
            runner, make_drafter, prompts, max_new_tokens, sampling, on_prompt=lambda _: advance()
        )


def _timed(decode: Callable[..., DecodeResult], *args) -> tuple[DecodeResult, float]:
    start = time.perf_counter()
    result = decode(*args)
    return result, time.perf_counter() - start


def measure_side_by_side(
    runner: Runner,
    make_drafter: Callable[[], Drafter],
    prompts: list[tuple[str, list[int]]],
    max_new_tokens: int,
    sampling: SamplingConfig = GREEDY,
    on_prompt: Callable[[PromptMeasurement], None] | None = None,
) -> Measurement:
    """prompts: (id, token ids) pairs, already templated."""
    return measure_variants(
        runner, {"method": make_drafter}, prompts, max_new_tokens, sampling, on_prompt
    )["method"]


def measure_variants(
    runner: Runner,
    makers: Mapping[str, Callable[[], Drafter]],
    prompts: list[tuple[str, list[int]]],
    max_new_tokens: int,
    sampling: SamplingConfig = GREEDY,
    on_prompt: Callable[[PromptMeasurement], None] | None = None,
) -> dict[str, Measurement]:
    """Several methods against plain greedy, interleaved prompt by prompt: each prompt is
    decoded plainly once and by every method, the order rotating from prompt to prompt,
    so that a change in the machine's speed falls on all of them alike."""
    drafters = {name: make() for name, make in makers.items()}
    warm_ids = prompts[0][1]
    decode_plain(runner, warm_ids, WARMUP_TOKENS, sampling)
    for drafter in drafters.values():
        decode_speculative(runner, drafter, warm_ids, WARMUP_TOKENS, sampling)
    measurements = {name: Measurement() for name in drafters}
    names: list[str | None] = [None, *drafters]  # None: plain greedy
    for index, (prompt_id, ids) in enumerate(prompts):
        shift = index % len(names)
        order = names[shift:] + names[:shift]
        runs: dict[str | None, tuple[DecodeResult, float]] = {}
        for name in order:
            if name is None:
                runs[name] = _timed(decode_plain, runner, ids, max_new_tokens, sampling)
            else:
                runs[name] = _timed(
                    decode_speculative, runner, drafters[name], ids, max_new_tokens, sampling
                )
        plain, plain_s = runs[None]
        for name in drafters:
            method, method_s = runs[name]
            row = PromptMeasurement(
                prompt_id=prompt_id,
                baseline_tokens=len(plain.tokens),
                baseline_seconds=plain_s,
                method_tokens=len(method.tokens),
                method_seconds=method_s,
                steps=method.steps,
                drafted=method.drafted,
                accepted=method.accepted,
                lossless=(method.tokens == plain.tokens) if sampling.greedy else None,
            )
            measurements[name].prompts.append(row)
            if on_prompt:
                on_prompt(row)
    return measurements
