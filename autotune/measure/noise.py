"""Is the machine quiet enough to time? A short probe before timing and between the
batches of a measurement.

Three readings: what other processes use of the cores while we are idle (a CPU hog, a
build, another benchmark), how much repeated identical target forwards vary (the noise a
timing will carry), and whether torch runs more threads than the cores this process may
use (threads then fight each other). Other processes' load and surplus threads are
evidence in themselves; varying forwards count only when they vary again in a second
round, so one noisy round of a few forwards does not call a quiet machine busy. A busy
machine is said in one line, given a moment to settle, and recorded in the profile
(``environment.noise``): never measured silently.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from dataclasses import asdict, dataclass, field

import torch

from autotune.engine.runner import Runner
from autotune.measure.stats import robust_spread

PROBE_FORWARDS = 12  # identical single-token forwards timed per probe
BUSY_OTHER_CORES = 0.3  # other processes using more than this many cores: busy
BUSY_SPREAD = 0.06  # identical forwards varying more than this (MAD / median): noisy
SETTLE_TRIES = 3  # probes before giving up on a quiet machine
SETTLE_WAIT_S = 5.0
# On a busy CPU one torch thread is tried, and kept when a forward is at least this much
# faster: threads that wait on each other for cores other processes hold lose more than
# the second thread gives (2 cores beside three CPU hogs: 350 ms a forward at 2 threads,
# 110 ms at 1; quiet: 31 ms at 2, 52 ms at 1).
FEWER_THREADS_GAIN = 1.15


def available_cores() -> int:
    """The cores this process may run on (a container's or taskset's share)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def set_threads(threads: int | None) -> int:
    """Torch's thread count, set deliberately: ``threads``, else the cores available."""
    count = threads or available_cores()
    torch.set_num_threads(count)
    return count


@dataclass
class Reading:
    """One probe of the machine."""

    forward_ms: float  # median time of one single-token target forward
    # MAD / median of those forwards; where a second round was timed, the lesser of the
    # two rounds' (the variation that repeated)
    spread: float
    other_cores: float  # cores other processes used while we were idle
    cores: int
    threads: int  # torch threads
    reasons: list[str] = field(default_factory=list)  # why it counts as busy, if it does
    rounds: int = 1  # rounds of forwards timed: two where the first varied on its own

    @property
    def busy(self) -> bool:
        return bool(self.reasons)

    def as_dict(self) -> dict:
        return {
            **asdict(self),
            "forward_ms": round(self.forward_ms, 3),
            "spread": round(self.spread, 4),
            "other_cores": round(self.other_cores, 2),
            "busy": self.busy,
        }


def other_load(seconds: float = 0.5) -> float:
    """Cores used by other processes over ``seconds`` while this one sleeps."""
    import psutil

    me = psutil.Process()
    me.cpu_percent(None)
    total = psutil.cpu_percent(interval=seconds)  # all cores, percent of the whole
    mine = me.cpu_percent(None) / 100.0  # in cores
    return max(0.0, total / 100.0 * (psutil.cpu_count() or 1) - mine)


def forward_times(runner: Runner, forwards: int) -> list[float]:
    """Seconds each of ``forwards`` identical single-token forwards takes after a short
    context (one more before them, untimed, warms up)."""
    cache = runner.new_cache(capacity=96)
    context = torch.arange(1, 65, device=runner.device) % runner.config.vocab_size
    runner.forward(context, torch.arange(64, device=runner.device), cache, last_only=True)
    token, position = context[-1:], torch.tensor([64], device=runner.device)
    times = []
    for _ in range(forwards + 1):
        cache.crop(64)
        start = time.perf_counter()
        runner.forward(token, position, cache)
        if runner.device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return times[1:]


def probe(runner: Runner, forwards: int = PROBE_FORWARDS) -> Reading:
    """Read the others' load and time identical forwards. Where the forwards vary more
    than ``BUSY_SPREAD`` and nothing else says the machine is busy, a second round is
    timed, and the variation counts only if it repeats: a quiet run was once called busy
    on one 6-forward probe's 7% while every other probe was quiet."""
    others = other_load()
    times = forward_times(runner, forwards)
    reading = Reading(
        statistics.median(times) * 1e3,
        robust_spread(times),
        others,
        available_cores(),
        torch.get_num_threads(),
    )
    if reading.spread > BUSY_SPREAD and not loaded(reading):
        again = forward_times(runner, forwards)
        reading = dataclasses.replace(
            reading,
            forward_ms=statistics.median(times + again) * 1e3,
            spread=min(reading.spread, robust_spread(again)),
            rounds=2,
        )
    return dataclasses.replace(reading, reasons=busy_reasons(reading))


def loaded(reading: Reading) -> bool:
    """Whether the machine is busy in itself: other processes' load, surplus threads."""
    return reading.other_cores > BUSY_OTHER_CORES or reading.threads > reading.cores


def busy_reasons(reading: Reading) -> list[str]:
    reasons = []
    if reading.other_cores > BUSY_OTHER_CORES:
        reasons.append(f"other processes use {reading.other_cores:.1f} of {reading.cores} cores")
    if reading.spread > BUSY_SPREAD:
        reasons.append(f"identical forwards vary by {reading.spread:.0%}")
    if reading.threads > reading.cores:
        reasons.append(f"torch runs {reading.threads} threads on {reading.cores} cores")
    return reasons


def settle(
    runner: Runner, say=None, tries: int = SETTLE_TRIES, wait_s: float = SETTLE_WAIT_S
) -> list[Reading]:
    """Probe; while the machine is busy, say so once, wait and probe again (``tries``
    probes in all). Returns every reading, the last one is what timing starts on."""
    readings = [probe(runner)]
    while readings[-1].busy and len(readings) < tries:
        if say is not None and len(readings) == 1:
            say(
                f"[yellow]the machine is busy ({'; '.join(readings[-1].reasons)}): waiting "
                f"for it to settle before timing[/yellow]"
            )
        time.sleep(wait_s)
        readings.append(probe(runner))
    return readings


def fewer_threads(runner: Runner, reading: Reading) -> Reading | None:
    """On a busy CPU where torch runs several threads, a probe at one thread (its kernel
    choices read from this machine's record only: ``kernels.read_only``). Returns that
    reading, with one thread kept, when it is ``FEWER_THREADS_GAIN`` faster; else None,
    with the threads and kernel timing as they were."""
    from autotune.engine import kernels

    if not reading.busy or reading.threads <= 1 or runner.device.type != "cpu":
        return None
    kernels.read_only()
    torch.set_num_threads(1)
    fewer = probe(runner)
    if fewer.forward_ms * FEWER_THREADS_GAIN <= reading.forward_ms:
        return fewer
    torch.set_num_threads(reading.threads)
    kernels.read_only(False)
    return None


@dataclass
class NoiseRecord:
    """What a run saw of the machine: before timing, and between measurement batches.

    The run was busy when a reading its timing stood on was busy (``timed_on``: the last
    before timing, the ones before it were the machine settling, and every one during);
    ``as_dict`` names those readings, so the record says no more than its readings do."""

    before: list[Reading] = field(default_factory=list)
    during: list[Reading] = field(default_factory=list)

    def timed_on(self) -> list[tuple[str, Reading]]:
        """The readings the timing stood on, each named by its place in ``as_dict``."""
        last = [(f"before[{len(self.before) - 1}]", self.before[-1])] if self.before else []
        return last + [(f"during[{i}]", reading) for i, reading in enumerate(self.during)]

    def busy_readings(self) -> list[str]:
        return [place for place, reading in self.timed_on() if reading.busy]

    @property
    def busy(self) -> bool:
        return bool(self.busy_readings())

    def reasons(self) -> list[str]:
        seen: dict[str, None] = {}
        for _, reading in self.timed_on():
            for reason in reading.reasons:
                seen.setdefault(reason, None)
        return list(seen)

    def as_dict(self) -> dict:
        forwards = [reading.forward_ms for _, reading in self.timed_on()]
        return {
            "busy": self.busy,
            "reasons": self.reasons(),
            "busy_readings": self.busy_readings(),  # which of before and during said busy
            "before": [r.as_dict() for r in self.before],
            "during": [r.as_dict() for r in self.during],
            # how far the machine's speed drifted over the run: timing is interleaved, so
            # drift cancels in the ratios, but a large one says the run was disturbed
            "forward_ms_range": [round(min(forwards), 3), round(max(forwards), 3)]
            if forwards
            else None,
        }
