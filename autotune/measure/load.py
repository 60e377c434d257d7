"""Speculation under load: throughput with several requests in flight, per concurrency.

At each concurrency level, plain greedy decoding and each candidate setting decode the
same round of prompts with that many requests in flight (``engine.batched``), one after
another in an order that alternates between rounds; a round is a pair per candidate,
(candidate seconds, tokens, plain seconds, tokens), and the speedup's interval is the
paired bootstrap over rounds (``measure.stats``). The seconds are decoding's: prefills
are timed apart (``engine.batched``), as they cost the same either way. A round holds
twice as many prompts as requests in flight, so that requests arrive while others
decode, as on a server.

The chosen setting of a level is the fastest candidate whose interval lies above 1.0,
else ``off`` (plain decoding: what the serving engine does with speculation switched off
at that batch size). The crossover is the lowest level from which every level is off.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from autotune.engine.batched import BatchRun, Prefills, decode_batch
from autotune.engine.proposal import Drafter
from autotune.engine.runner import Runner
from autotune.measure.stats import Interval, Pairs, bootstrap_interval

LEVELS = (1, 2, 4, 8)
OFF = "off"
TUNED = "tuned"
MIN_ROUNDS = 3  # fewer rounds give no interval worth a choice
MAX_LEVEL = 256


def parse_levels(text: str) -> tuple[int, ...]:
    """``--concurrency``: comma-separated request counts (``1,2,4,8``), ascending; ``0``
    or ``none``: no measurement under load."""
    from autotune.errors import AutotuneError

    if text.strip().lower() in ("0", "none", "off"):
        return ()
    try:
        levels = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        levels = []
    if not levels or levels[0] < 1 or levels[-1] > MAX_LEVEL:
        raise AutotuneError(
            f"--concurrency {text!r}: give request counts from 1 to {MAX_LEVEL}, separated "
            "by commas (e.g. 1,2,4,8), or none"
        )
    return tuple(levels)


def requests_text(count: int) -> str:
    """``1 request``, ``4 requests``."""
    return f"{count} request{'s' if count != 1 else ''}"


def label_of(cap: int | None) -> str:
    """A setting's name among its variants under load: the tuned one, or it capped."""
    return TUNED if cap is None else f"<= {cap} tokens"


@dataclass
class LevelFigure:
    """One setting at one concurrency, against plain decoding of the same rounds."""

    speedup: float
    interval: Interval
    tokens_per_s: float
    plain_tokens_per_s: float
    latency_s: float  # mean seconds from a request's arrival to its last token
    plain_latency_s: float
    lossless: bool

    def clearly_faster(self) -> bool:
        return self.lossless and self.interval.above(1.0)

    def summary(self) -> dict:
        """The figures as the profile and ``bench`` report them (plain's as baseline)."""
        return {
            "speedup": round(self.speedup, 4),
            "speedup_interval": self.interval.as_list(),
            "tokens_per_s": round(self.tokens_per_s, 2),
            "baseline_tokens_per_s": round(self.plain_tokens_per_s, 2),
            "latency_s": round(self.latency_s, 3),
            "baseline_latency_s": round(self.plain_latency_s, 3),
            "lossless": self.lossless,
        }


@dataclass
class LevelResult:
    concurrency: int
    rounds: int
    figures: dict[str, LevelFigure] = field(default_factory=dict)

    def chosen(self) -> str:
        """The fastest setting clearly faster than plain decoding here, else ``OFF``."""
        paying = {name: f for name, f in self.figures.items() if f.clearly_faster()}
        if not paying:
            return OFF
        return max(paying, key=lambda name: paying[name].speedup)

    def speedup_of(self, name: str) -> float:
        return 1.0 if name == OFF else self.figures[name].speedup


def schedule_of(levels: Iterable[LevelResult]) -> dict[int, str]:
    """Each level's chosen setting."""
    return {level.concurrency: level.chosen() for level in levels}


def crossover(schedule: Mapping[int, str]) -> int | None:
    """The lowest concurrency from which speculation is off at every measured level; None
    where it pays at the highest level measured."""
    found = None
    for concurrency in sorted(schedule, reverse=True):
        if schedule[concurrency] != OFF:
            break
        found = concurrency
    return found


def best_fixed(levels: list[LevelResult]) -> str | None:
    """The one setting with the highest mean speedup over the levels (what a deployment
    without a per-batch schedule would pick)."""
    names = set.intersection(*(set(level.figures) for level in levels)) if levels else set()
    if not names:
        return None
    return max(
        sorted(names), key=lambda n: sum(level.speedup_of(n) for level in levels) / len(levels)
    )


# How a round is decoded: (setting name, or OFF for plain decoding; the round's prompts;
# requests in flight) -> what the decoding did.
RunRound = Callable[[str, list[list[int]], int], BatchRun]
# Whether a setting's output that differs from plain decoding's is still lossless: (the
# prompt, the setting's tokens, plain's) -> bool (``measure.ties.lossless_up_to_a_tie``)
SameOutput = Callable[[list[int], list[int], list[int]], bool]


def in_engine(
    runner: Runner, max_new_tokens: int, makers: Mapping[str, Callable[[], Drafter]]
) -> RunRound:
    """Rounds decoded by autotune's engine (``engine.batched``): OFF plain, each setting
    with its own drafter per request; a round's prefills made once, for all of them."""
    prefills = Prefills()
    last: list[list[int]] = []

    def run(name: str, batch: list[list[int]], concurrency: int) -> BatchRun:
        if batch != last:  # a new round: its prompts' prefills, not the last round's
            prefills.clear()
            last[:] = batch
        make = None if name == OFF else makers[name]
        return decode_batch(runner, batch, max_new_tokens, concurrency, make, prefills)

    return run


def measure_level(
    run_round: RunRound,
    names: list[str],
    prompts: list[list[int]],
    concurrency: int,
    rounds: int,
    deadline: float | None = None,
    on_round: Callable[[int], None] | None = None,
    same: SameOutput | None = None,
) -> LevelResult:
    """Plain decoding and every setting of ``names`` on ``rounds`` rounds of
    ``2 * concurrency`` prompts (taken in turn from ``prompts``, wrapping around); fewer
    rounds where ``deadline`` (a ``time.monotonic`` instant) comes first, but at least
    MIN_ROUNDS. A setting stays lossless while its outputs are plain decoding's, or
    differ where ``same`` says they still are (None: only equal outputs)."""
    per_round = 2 * concurrency
    rows: dict[str, list[tuple[float, int, float, int]]] = {name: [] for name in names}
    latencies: dict[str, list[float]] = {name: [] for name in [OFF, *names]}
    lossless = dict.fromkeys(names, True)
    done = 0
    for index in range(rounds):
        if deadline is not None and index >= MIN_ROUNDS and time.monotonic() > deadline:
            break
        start = index * per_round
        batch = [prompts[(start + i) % len(prompts)] for i in range(per_round)]
        order = [OFF, *names]
        if index % 2:
            order.reverse()
        runs = {name: run_round(name, batch, concurrency) for name in order}
        plain = runs[OFF]
        latencies[OFF].extend(plain.latencies)
        for name in names:
            run = runs[name]
            rows[name].append((run.decode_seconds, run.tokens, plain.decode_seconds, plain.tokens))
            latencies[name].extend(run.latencies)
            lossless[name] = lossless[name] and all(
                a.tokens == b.tokens or (same is not None and same(p, a.tokens, b.tokens))
                for p, a, b in zip(batch, run.results, plain.results, strict=True)
            )
        done += 1
        if on_round is not None:
            on_round(done)
    result = LevelResult(concurrency, done)
    plain_latency = _mean(latencies[OFF])
    for name in names:
        pairs = Pairs.of(rows[name])
        plain_tps = float(pairs.baseline_tokens.sum() / max(pairs.baseline_seconds.sum(), 1e-9))
        result.figures[name] = LevelFigure(
            speedup=pairs.speedup(),
            interval=bootstrap_interval(pairs),
            tokens_per_s=float(pairs.method_tokens.sum() / max(pairs.method_seconds.sum(), 1e-9)),
            plain_tokens_per_s=plain_tps,
            latency_s=_mean(latencies[name]),
            plain_latency_s=plain_latency,
            lossless=lossless[name],
        )
    return result


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0
