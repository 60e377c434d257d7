"""Side-by-side wall-clock measurement of methods against plain greedy decoding.

All run in this process on the same prompts, interleaved prompt by prompt: each prompt
is decoded plainly once and by every method, the order rotating from one prompt to the
next (with one method: plain then method, then method then plain, ...), so that a drift
of the machine's speed falls on all of them alike. Every figure reported comes with a
95% interval from a paired bootstrap over prompts (``measure.stats``), and, when prompts
carry categories, per category.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from autotune.budget import Budget
from autotune.engine.decoding import (
    DecodeResult,
    decode_plain,
    decode_speculative,
    tokens_per_step,
)
from autotune.engine.proposal import Drafter
from autotune.engine.runner import Runner
from autotune.engine.sampling import GREEDY, SamplingConfig
from autotune.measure import ties
from autotune.measure.stats import CONFIDENCE, Interval, Pairs, bootstrap_interval, look_confidence
from autotune.measure.ties import Divergence, judge
from autotune.progress import say

WARMUP_TOKENS = 8
# A measurement cut short by its time limit still pairs this many prompts.
MIN_PROMPTS = 2


@dataclass(frozen=True)
class EncodedPrompt:
    """A prompt as the model reads it: its id, its token ids (chat template applied) and
    its workload category, if the prompts file gave one."""

    id: str
    ids: list[int]
    category: str | None = None


def categories_in_turn(prompts: list[EncodedPrompt], count: int) -> list[EncodedPrompt]:
    """``count`` prompts taken in turn from each category (in the order they first
    appear), each category's in file order."""
    groups: dict[str | None, list[EncodedPrompt]] = {}
    for prompt in prompts:
        groups.setdefault(prompt.category, []).append(prompt)
    queues = [list(group) for group in groups.values()]
    out: list[EncodedPrompt] = []
    while len(out) < count and any(queues):
        for queue in queues:
            if queue and len(out) < count:
                out.append(queue.pop(0))
    return out


@dataclass(frozen=True)
class Variant:
    """A setting to measure: its drafter and, where the setting differs by workload
    category, another drafter for the prompts of that category."""

    make: Callable[[], Drafter]
    by_category: Mapping[str, Callable[[], Drafter]] = field(default_factory=dict)


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
    category: str | None = None
    # where a greedy output parted from plain greedy output (lossless if a numeric tie)
    divergence: Divergence | None = None

    @classmethod
    def of(
        cls,
        prompt: EncodedPrompt,
        baseline: tuple[int, float],
        method: DecodeResult,
        method_seconds: float,
        lossless: bool | None,
        divergence: Divergence | None = None,
    ) -> PromptMeasurement:
        """``prompt``'s row: the method's decoding (``method`` in ``method_seconds``)
        against the baseline's (its tokens and seconds)."""
        return cls(
            prompt_id=prompt.id,
            baseline_tokens=baseline[0],
            baseline_seconds=baseline[1],
            method_tokens=len(method.tokens),
            method_seconds=method_seconds,
            steps=method.steps,
            drafted=method.drafted,
            accepted=method.accepted,
            lossless=lossless,
            category=prompt.category,
            divergence=divergence,
        )


@dataclass
class Measurement:
    prompts: list[PromptMeasurement] = field(default_factory=list)
    looks: int = 1  # planned looks of a sequential measurement: the interval allows for them

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

    def first_loss(self) -> str | None:
        """The first prompt whose output changed, and where (None if none did)."""
        for p in self.prompts:
            if p.lossless is False:
                where = f": {p.divergence.describe()}" if p.divergence else ""
                return f"prompt {p.prompt_id}{where}"
        return None

    def pairs(self) -> Pairs:
        return Pairs.of(
            (p.method_seconds, p.method_tokens, p.baseline_seconds, p.baseline_tokens)
            for p in self.prompts
        )

    def interval(self, confidence: float = CONFIDENCE) -> Interval:
        """The speedup's interval at ``confidence``, allowing for the planned looks."""
        return bootstrap_interval(self.pairs(), look_confidence(confidence, self.looks))

    def categories(self) -> dict[str, Measurement]:
        """The prompts of each category (only when prompts carry more than one)."""
        groups: dict[str, list[PromptMeasurement]] = {}
        for p in self.prompts:
            if p.category is not None:
                groups.setdefault(p.category, []).append(p)
        if len(groups) < 2:
            return {}
        return {name: Measurement(rows, self.looks) for name, rows in sorted(groups.items())}

    def summary(self, with_categories: bool = True) -> dict:
        interval = self.interval() if self.prompts else None
        out: dict[str, object] = {
            "speedup": round(self.speedup, 4),
            "speedup_interval": interval.as_list() if interval else None,
            "interval_confidence": CONFIDENCE,
            "looks": self.looks,
            "tokens_per_step": round(self.tokens_per_step, 4),
            "acceptance_rate": round(self.acceptance_rate, 4),
            "tokens_per_s": round(self.tokens_per_s, 3),
            "baseline_tokens_per_s": round(self.baseline_tokens_per_s, 3),
            "lossless": self.lossless,
            "prompts": len(self.prompts),
            "tokens": int(self._total("method_tokens")),
        }
        categories = self.categories() if with_categories else {}
        if categories:
            out["by_category"] = {
                name: m.summary(with_categories=False) for name, m in categories.items()
            }
        return out

    def per_prompt(self) -> list[dict]:
        return [
            {
                "prompt": p.prompt_id,
                "category": p.category,
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


def interval_text(measured: Measurement | dict) -> str:
    """``1.123x [1.051, 1.194]``: a speedup and its interval, for people."""
    row = measured.summary(with_categories=False) if isinstance(measured, Measurement) else measured
    interval = row.get("speedup_interval")
    bounds = f" [{interval[0]:.3f}, {interval[1]:.3f}]" if interval else ""
    return f"{row['speedup']:.3f}x{bounds}"


def measure_with_progress(
    label: str,
    runner: Runner,
    make_drafter: Callable[[], Drafter],
    prompts: Sequence[EncodedPrompt],
    max_new_tokens: int,
    sampling: SamplingConfig = GREEDY,
    until: Budget | None = None,
) -> Measurement:
    """``measure_side_by_side`` with a progress bar, one step a prompt (``until``: as
    ``measure_variants`` takes it)."""
    from autotune.progress import step

    with step(label, len(prompts)) as advance:
        return measure_side_by_side(
            runner,
            make_drafter,
            prompts,
            max_new_tokens,
            sampling,
            on_prompt=lambda _: advance(),
            until=until,
        )


def measure_side_by_side(
    runner: Runner,
    make_drafter: Callable[[], Drafter],
    prompts: Sequence[EncodedPrompt],
    max_new_tokens: int,
    sampling: SamplingConfig = GREEDY,
    on_prompt: Callable[[PromptMeasurement], None] | None = None,
    until: Budget | None = None,
) -> Measurement:
    """One method against plain greedy decoding (``until``: as ``measure_variants``)."""
    return measure_variants(
        runner, {"method": make_drafter}, prompts, max_new_tokens, sampling, on_prompt, until
    )["method"]


def measure_variants(
    runner: Runner,
    variants: Mapping[str, Variant | Callable[[], Drafter]],
    prompts: Sequence[EncodedPrompt],
    max_new_tokens: int,
    sampling: SamplingConfig = GREEDY,
    on_prompt: Callable[[PromptMeasurement], None] | None = None,
    until: Budget | None = None,
    least: int = MIN_PROMPTS,
) -> dict[str, Measurement]:
    """Several methods against one plain greedy decoding per prompt, interleaved.
    ``until``: no prompt is started once it is spent, after the first ``least``."""
    session = SideBySide(runner, variants, max_new_tokens, sampling)
    session.measure(prompts, on_prompt, until, least)
    return session.measurements


class SideBySide:
    """A measurement that can go on in batches (a sequential measurement looks at the
    figures between them): the drafters are built and warmed up once, and the order of
    decoding keeps rotating from batch to batch."""

    def __init__(
        self,
        runner: Runner,
        variants: Mapping[str, Variant | Callable[[], Drafter]],
        max_new_tokens: int,
        sampling: SamplingConfig = GREEDY,
    ):
        self.runner, self.max_new_tokens, self.sampling = runner, max_new_tokens, sampling
        self.variants = {
            name: v if isinstance(v, Variant) else Variant(v) for name, v in variants.items()
        }
        self._drafters: dict[tuple[str, str | None], Drafter] = {}
        self.measurements = {name: Measurement() for name in self.variants}
        self._measured = 0
        self._warm = False
        self._slowest_s = 0.0  # the longest one prompt's decodings have taken
        self._told: set[str] = set()  # variants whose numeric tie was said

    def drop(self, name: str) -> None:
        """``name`` decodes no more; what it measured stays."""
        self.variants.pop(name, None)

    def drafter(self, name: str, category: str | None) -> Drafter:
        variant = self.variants[name]
        key = (name, category if category in variant.by_category else None)
        if key not in self._drafters:
            make = variant.by_category.get(category or "", variant.make)
            self._drafters[key] = make()
        return self._drafters[key]

    def warm_up(self, prompt: EncodedPrompt) -> None:
        decode_plain(self.runner, prompt.ids, WARMUP_TOKENS, self.sampling)
        for name in self.variants:
            decode_speculative(
                self.runner,
                self.drafter(name, prompt.category),
                prompt.ids,
                WARMUP_TOKENS,
                self.sampling,
            )
        self._warm = True

    def measure(
        self,
        prompts: Sequence[EncodedPrompt],
        on_prompt: Callable[[PromptMeasurement], None] | None = None,
        until: Budget | None = None,
        least: int = MIN_PROMPTS,
        deadline: Budget | None = None,
    ) -> int:
        """Measure ``prompts`` in turn (past ``until``'s time, no more than ``least``);
        none starts that ``deadline``, the whole run's (None: the one ``until`` lies
        within), leaves no time to finish, going by the slowest prompt so far (but the
        first prompt of all); the number measured."""
        if deadline is None and until is not None:
            deadline = until.within
        if prompts and not self._warm:
            self.warm_up(prompts[0])
        names: list[str | None] = [None, *self.variants]  # None: plain greedy
        measured = 0
        for i, prompt in enumerate(prompts):
            if until is not None and i >= least and until.spent():
                break
            if deadline is not None and self._past(deadline):
                break
            measured += 1
            shift = self._measured % len(names)
            self._measured += 1
            runs = {name: self._decode(name, prompt) for name in names[shift:] + names[:shift]}
            self._slowest_s = max(self._slowest_s, sum(seconds for _, seconds in runs.values()))
            self._record(prompt, runs, on_prompt)
        return measured

    def _past(self, deadline: Budget) -> bool:
        """Whether another prompt would end past ``deadline`` (a prompt started with a
        second left ran 18 s past a busy run's --budget)."""
        left = deadline.left()
        return self._measured > 0 and left is not None and left < self._slowest_s

    def _decode(self, name: str | None, prompt: EncodedPrompt) -> tuple[DecodeResult, float]:
        """``prompt`` decoded, timed, by variant ``name`` (None: plain greedy)."""
        if name is None:
            return _timed(decode_plain, self.runner, prompt.ids, self.max_new_tokens, self.sampling)
        return _timed(
            decode_speculative,
            self.runner,
            self.drafter(name, prompt.category),
            prompt.ids,
            self.max_new_tokens,
            self.sampling,
        )

    def _record(
        self,
        prompt: EncodedPrompt,
        runs: dict[str | None, tuple[DecodeResult, float]],
        on_prompt: Callable[[PromptMeasurement], None] | None,
    ) -> None:
        """Each variant's decoding of ``prompt`` against the plain one, kept in its
        measurement (and told to ``on_prompt``)."""
        plain, plain_s = runs[None]
        for name in self.variants:
            method, method_s = runs[name]
            lossless, divergence = None, None
            if self.sampling.greedy:
                divergence = judge(self.runner, prompt.ids, method.tokens, plain.tokens)
                lossless = ties.lossless(divergence)
                if divergence is not None and divergence.tie and name not in self._told:
                    self._told.add(name)  # once a variant: a GPU may part at many prompts
                    say(f"[dim]{name}, prompt {prompt.id}: {divergence.describe()}[/dim]")
            baseline = (len(plain.tokens), plain_s)
            row = PromptMeasurement.of(prompt, baseline, method, method_s, lossless, divergence)
            self.measurements[name].prompts.append(row)
            if on_prompt:
                on_prompt(row)


def _timed(decode: Callable[..., DecodeResult], *args) -> tuple[DecodeResult, float]:
    start = time.perf_counter()
    result = decode(*args)
    return result, time.perf_counter() - start
