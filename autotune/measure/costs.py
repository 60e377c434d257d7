"""What a forward pass costs on this device: the verify-latency curve and sublayer costs."""

from __future__ import annotations

import itertools
import statistics
import time
from dataclasses import dataclass

import torch

from autotune.budget import Budget
from autotune.engine.runner import Runner
from autotune.engine.skip import NO_SKIP, SkipMask
from autotune.errors import AutotuneError

CONTEXT_TOKENS = 160  # a typical prompt plus part of an answer


@dataclass
class LatencyCurve:
    """seconds[n - 1]: median time of one target forward over n new tokens."""

    seconds: list[float]

    def __call__(self, n: int) -> float:
        if n <= len(self.seconds):
            return self.seconds[n - 1]
        # past the measured range, extrapolate linearly from the last two points
        slope = self.seconds[-1] - self.seconds[-2] if len(self.seconds) > 1 else self.seconds[-1]
        return self.seconds[-1] + slope * (n - len(self.seconds))

    def relative(self) -> list[float]:
        return [s / self.seconds[0] for s in self.seconds]


@dataclass
class SublayerCosts:
    """Seconds of one single-token forward, split into fixed, per-attention and per-MLP."""

    fixed: float
    attention: float
    mlp: float
    num_layers: int

    def forward_seconds(self, skip: SkipMask = NO_SKIP) -> float:
        kept_attention = self.num_layers - len(skip.attention)
        kept_mlp = self.num_layers - len(skip.mlp)
        return self.fixed + kept_attention * self.attention + kept_mlp * self.mlp

    def draft_ratio(self, skip: SkipMask) -> float:
        """Cost of a draft forward relative to a full one."""
        return self.forward_seconds(skip) / self.forward_seconds()


def _prepared_cache(runner: Runner, context: int):
    cache = runner.new_cache(capacity=context + 160)
    # drawn on the CPU (a CPU generator cannot draw on CUDA), then moved
    tokens = torch.randint(
        0, runner.config.vocab_size, (context,), generator=torch.Generator().manual_seed(0)
    ).to(runner.device)
    runner.forward(tokens, torch.arange(context, device=runner.device), cache, last_only=True)
    return cache


def _time_forward(runner: Runner, cache, context: int, n: int, skip: SkipMask) -> float:
    cache.crop(context)
    tokens = torch.ones(n, dtype=torch.long, device=runner.device)
    start = time.perf_counter()
    runner.forward(
        tokens, torch.arange(context, context + n, device=runner.device), cache, skip=skip
    )
    if runner.device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


# A curve whose n-token forward costs less than this share of a smaller size's was timed
# while the machine's speed changed under it (seen on a busy machine: 4 tokens at 0.29x).
PLAUSIBLE_RATIO = 0.6
# Forwards quicker than this (a tiny test model) time overheads, not the model: their
# curve is noise whatever the machine does, and is not judged.
JUDGED_FROM_S = 0.005
CURVE_TRIES = 3


def implausible(curve: LatencyCurve) -> str | None:
    """What is wrong with a measured verify-latency curve, or None. Verifying more tokens
    never costs much less than verifying fewer: a curve that says so was timed on a
    machine whose speed changed under it."""
    seconds = curve.seconds
    if seconds[0] < JUDGED_FROM_S:
        return None
    for n in range(2, len(seconds) + 1):
        slowest_before = max(seconds[: n - 1])
        if seconds[n - 1] < PLAUSIBLE_RATIO * slowest_before:
            fewer = seconds.index(slowest_before) + 1
            return (
                f"verifying {n} tokens took {seconds[n - 1] / slowest_before:.2f}x the time "
                f"of verifying {fewer}"
            )
    return None


def measure_verify_curve(
    runner: Runner,
    max_tokens: int,
    repeats: int,
    progress=None,
    say=None,
    sparse: bool = False,
    until: Budget | None = None,
) -> LatencyCurve:
    """``measure_latency_curve``, measured again while it is implausible (the machine was
    busy), at most ``CURVE_TRIES`` times and not past ``until``; then refused with one
    line, or, with ``until`` (a run that must end in time), evened out to its running
    maximum and said so. ``sparse``: only the sizes of ``grid_sizes`` are timed, the
    others interpolated."""
    sizes = grid_sizes(max_tokens) if sparse else None
    for attempt in range(1, CURVE_TRIES + 1):
        curve = measure_latency_curve(
            runner, max_tokens, repeats, progress=progress, sizes=sizes, until=until
        )
        problem = implausible(curve)
        if problem is None:
            return curve
        last = attempt == CURVE_TRIES or (until is not None and until.spent())
        if last and until is not None:
            if say is not None:
                say(
                    f"[yellow]the verify-latency curve is not plausible ({problem}): the "
                    "machine is busy, and the time is spent; its running maximum is used, "
                    "and the profile says the machine was busy[/yellow]"
                )
            return LatencyCurve(list(itertools.accumulate(curve.seconds, max)))
        if last:
            break
        if say is not None:
            say(
                f"[yellow]the verify-latency curve is not plausible ({problem}): the machine "
                f"was busy; measuring it again[/yellow]"
            )
    raise AutotuneError(
        f"the verify-latency curve stayed implausible after {CURVE_TRIES} "
        f"measurements ({problem}): the machine is too busy to time; stop "
        "other work on it and run again"
    )


# The sizes a sparse curve times: every size up to 6, then about a quarter apart. Timing
# all 128 sizes took ~3 minutes of a 20-minute profile on 2 cores; this grid takes ~20 s.
CURVE_GRID = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 40, 48, 64, 80, 96, 128)


def grid_sizes(max_tokens: int) -> list[int]:
    """The grid's sizes below ``max_tokens``, and ``max_tokens`` itself."""
    return sorted({n for n in CURVE_GRID if n < max_tokens} | {max_tokens})


def measure_latency_curve(
    runner: Runner,
    max_tokens: int = 16,
    repeats: int = 7,
    context: int = CONTEXT_TOKENS,
    progress=None,
    sizes: list[int] | None = None,
    until: Budget | None = None,
) -> LatencyCurve:
    """Rounds over all sizes (or over ``sizes``, the others interpolated linearly), so
    that a slow spell of the machine hits every size alike; past ``until`` no round
    starts after the first timed one."""
    timed = sizes or list(range(1, max_tokens + 1))
    cache = _prepared_cache(runner, context)
    samples: dict[int, list[float]] = {n: [] for n in timed}
    for _ in range(repeats + 1):  # the first round is warm-up
        # an untimed forward first: the smallest size right after the largest ran ~1.7x
        # slow (measured on 2 cores), which made n = 2 look cheaper than n = 1
        _time_forward(runner, cache, context, 1, NO_SKIP)
        for n in timed:
            samples[n].append(_time_forward(runner, cache, context, n, NO_SKIP))
        if progress:
            progress()
        if until is not None and until.spent() and len(samples[timed[0]]) >= 2:
            break
    medians = {n: statistics.median(s[1:]) for n, s in samples.items()}
    return LatencyCurve(interpolated(medians, max_tokens))


def interpolated(points: dict[int, float], max_tokens: int) -> list[float]:
    """seconds[n - 1] for n = 1..max_tokens, linear between the measured sizes."""
    sizes = sorted(points)
    seconds = []
    for n in range(1, max_tokens + 1):
        above = next(m for m in sizes if m >= n)
        below = max((m for m in sizes if m <= n), default=above)
        if above == below:  # a measured size (or one below the smallest)
            seconds.append(points[above])
            continue
        weight = (n - below) / (above - below)
        seconds.append(points[below] + weight * (points[above] - points[below]))
    return seconds


def time_one_forward(runner: Runner, repeats: int = 5, context: int = CONTEXT_TOKENS) -> float:
    """Median seconds of one single-token forward after ``context`` tokens: the first
    point of a latency curve, timed again to check a cached one."""
    cache = _prepared_cache(runner, context)
    times = [_time_forward(runner, cache, context, 1, NO_SKIP) for _ in range(repeats + 1)]
    return statistics.median(times[1:])


def measure_sublayer_costs(
    runner: Runner, repeats: int = 15, context: int = CONTEXT_TOKENS
) -> SublayerCosts:
    cache = _prepared_cache(runner, context)
    layers = range(runner.num_layers)
    variants = {
        "full": NO_SKIP,
        "no_attention": SkipMask.of(attention=layers),
        "no_mlp": SkipMask.of(mlp=layers),
    }
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeats + 1):
        for name, skip in variants.items():
            samples[name].append(_time_forward(runner, cache, context, 1, skip))
    full, no_attn, no_mlp = (statistics.median(samples[k][1:]) for k in variants)
    count = runner.num_layers
    attention = max(full - no_attn, 0.0) / count
    mlp = max(full - no_mlp, 0.0) / count
    return SublayerCosts(
        fixed=max(full - count * (attention + mlp), 0.0),
        attention=attention,
        mlp=mlp,
        num_layers=count,
    )
