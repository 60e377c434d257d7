"""Plain greedy timings shared by the measured trials of one process.

A measured trial compares a method's decoding of each prompt with plain greedy decoding
of the same prompt. Plain greedy decoding does not depend on the trial's setting, so a
process (a Ray worker that Tune reuses from trial to trial) times it once per prompt and
lends that timing to every trial, halving what a trial decodes. So that a drift of the
machine's speed still cancels, a prompt's greedy decoding is timed again once its timing
is ``retime_after_s`` old; the re-timing and that trial's method decoding take turns to
go first. A trial re-times at most ``retime_per_trial`` prompts (the others wait for the
next trial), so that re-timing stays a small, steady part of every trial. (Re-timing
after every 3 trials that used a timing cost a third of a 12-prompt study on 2 cores:
the first prompts, which every trial decodes before ASHA may prune it, were re-timed in
nearly every trial.) The greedy tokens are kept: a method's output must equal them token
for token (greedy speculative decoding is lossless), else ``LossyDecoding``.

The rows are ``timing.PromptMeasurement``: a trial's rows make a ``timing.Measurement``
with its speedup, interval and summary.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from autotune.engine.decoding import DecodeResult, decode_plain, decode_speculative
from autotune.engine.proposal import Drafter
from autotune.engine.runner import Runner
from autotune.measure.ties import Divergence, judge
from autotune.measure.timing import WARMUP_TOKENS, EncodedPrompt, PromptMeasurement

# A prompt's greedy timing serves trials for this long before it is timed again: often
# enough that trials minutes apart do not compare with one stale figure, seldom enough
# that a trial decodes little besides its method.
RETIME_AFTER_S = 180.0
# Prompts one trial re-times at most (of its 8: an eighth of its decoding, at most).
RETIME_PER_TRIAL = 1


class LossyDecoding(RuntimeError):
    """A method's greedy output differed from plain greedy decoding."""


@dataclass
class _Greedy:
    tokens: list[int]
    seconds: float
    timed_at: float  # when (the clock's) the latest timing was taken
    timings: int = 1  # how often this prompt's greedy decoding was timed


class SharedGreedy:
    """Greedy decodings of prompts, timed in this process and lent to its trials."""

    def __init__(
        self,
        max_new_tokens: int,
        retime_after_s: float = RETIME_AFTER_S,
        retime_per_trial: int = RETIME_PER_TRIAL,
        clock: Callable[[], float] = time.monotonic,
    ):
        if retime_after_s < 0 or retime_per_trial < 1:
            raise ValueError("retime_after_s must be >= 0 and retime_per_trial >= 1")
        self.max_new_tokens = max_new_tokens
        self.retime_after_s = retime_after_s
        self.retime_per_trial = retime_per_trial
        self.clock = clock
        self._greedy: dict[tuple[int, ...], _Greedy] = {}
        self._warm = False
        self._retimed = 0  # prompts the current trial re-timed

    def warm_up(self, runner: Runner, drafter: Drafter, prompt: EncodedPrompt) -> None:
        """A trial starts: a few tokens of each decoder before timing (plain greedy once
        per process, the drafter once per trial, on its first prompt)."""
        self._retimed = 0
        if not self._warm:
            decode_plain(runner, prompt.ids, WARMUP_TOKENS)
            self._warm = True
        decode_speculative(runner, drafter, prompt.ids, WARMUP_TOKENS)

    def method_row(
        self, runner: Runner, prompt: EncodedPrompt, drafter: Drafter
    ) -> PromptMeasurement:
        """The drafter's decoding of ``prompt``, timed, beside this process's greedy timing
        of it (taken now when it has none, or when its latest is old and this trial may
        still re-time one).
        Raises ``LossyDecoding`` when the outputs differ."""
        key = tuple(prompt.ids)
        greedy = self._greedy.get(key)
        if greedy is None:  # first timing: plain first
            plain, plain_s = _timed(decode_plain, runner, prompt.ids, self.max_new_tokens)
            method, method_s = self._method(runner, drafter, prompt)
            greedy = self._greedy[key] = _Greedy(plain.tokens, plain_s, self.clock())
        elif (
            self.clock() - greedy.timed_at >= self.retime_after_s
            and self._retimed < self.retime_per_trial
        ):
            # re-timing: plain and method take turns to go first
            self._retimed += 1
            first_plain = greedy.timings % 2 == 0
            if first_plain:
                plain, plain_s = _timed(decode_plain, runner, prompt.ids, self.max_new_tokens)
            method, method_s = self._method(runner, drafter, prompt)
            if not first_plain:
                plain, plain_s = _timed(decode_plain, runner, prompt.ids, self.max_new_tokens)
            if plain.tokens != greedy.tokens:
                raise RuntimeError(f"prompt {prompt.id}: plain greedy decoding is not repeatable")
            greedy.seconds, greedy.timings = plain_s, greedy.timings + 1
            greedy.timed_at = self.clock()
        else:
            method, method_s = self._method(runner, drafter, prompt)
        divergence = _check_lossless(runner, prompt, method.tokens, greedy.tokens)
        baseline = (len(greedy.tokens), greedy.seconds)
        return PromptMeasurement.of(prompt, baseline, method, method_s, True, divergence)

    def timings(self, prompt: EncodedPrompt) -> int:
        """How often this process timed the prompt's greedy decoding."""
        greedy = self._greedy.get(tuple(prompt.ids))
        return greedy.timings if greedy else 0

    def _method(
        self, runner: Runner, drafter: Drafter, prompt: EncodedPrompt
    ) -> tuple[DecodeResult, float]:
        return _timed(decode_speculative, runner, drafter, prompt.ids, self.max_new_tokens)


def for_process(key: Hashable, max_new_tokens: int) -> SharedGreedy:
    """This process's shared greedy timings for a target (``key``, e.g. its ``TargetRef``)
    at ``max_new_tokens``: built on first use, kept while the process lives."""
    from autotune.process_cache import cached

    return cached(("shared_greedy", key, max_new_tokens), lambda: SharedGreedy(max_new_tokens))


def _check_lossless(
    runner: Runner, prompt: EncodedPrompt, method: list[int], greedy: list[int]
) -> Divergence | None:
    """None where the outputs are the same, the divergence where they part at a numeric
    tie (``ties``); else ``LossyDecoding``."""
    divergence = judge(runner, prompt.ids, method, greedy)
    if divergence is None or divergence.tie:
        return divergence
    raise LossyDecoding(
        f"prompt {prompt.id}: the method's output differs from plain greedy output "
        f"({divergence.describe()})"
    )


def _timed(decode: Callable[..., DecodeResult], *args) -> tuple[DecodeResult, float]:
    start = time.perf_counter()
    result = decode(*args)
    return result, time.perf_counter() - start
