"""The floor under a verify forward on this machine: streaming every weight once at the
memory's bandwidth, or multiplying them by n tokens at the GEMM peak, whichever is slower.

A measured curve's ratio to that floor says how far the engine is from the hardware: near
1 it can only get faster by reading fewer bytes or doing fewer flops; far above, the time
goes elsewhere (kernel choice, overheads, attention). Attention over the context and the
KV-cache reads are left out of the floor: at the curves' 160-token context they are a few
percent of the weights' bytes and flops.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from autotune.engine.runner import Runner
    from autotune.measure.costs import LatencyCurve

GIB = 2**30
# Sizes for `autotune latency --roofline`, and smaller ones inside a profile run, where the
# whole measurement must stay well under 2 s on 2 cores (256 MiB: 23.6 GB/s against
# 1 GiB's 26.3 there; a 1024 GEMM: within 5% of a 2048 one in float32).
BANDWIDTH_BYTES = GIB
QUICK_BANDWIDTH_BYTES = GIB // 4
CPU_GEMM_SIZE, CUDA_GEMM_SIZE, QUICK_CPU_GEMM_SIZE = 2048, 8192, 1024
PASSES = 5  # the fastest of this many, after one warm-up, counts


def measure_bandwidth(device: torch.device | str, nbytes: int = BANDWIDTH_BYTES) -> float:
    """Bytes per second this device's memory streams: the fastest of ``PASSES`` sums of
    a tensor of ``nbytes`` (fewer where free memory is short: a quarter of what is free).
    Summed as float32 whatever the model's dtype: the bytes are what is measured, and on
    2 cores a bfloat16 sum measured 18 GB/s, bound by its conversion, against 26 GB/s."""
    device = torch.device(device)
    size = min(nbytes, _free_bytes(device) // 4) // 4
    data = torch.ones(size, dtype=torch.float32, device=device)
    seconds = _fastest(lambda: data.sum(), device)
    return size * 4 / seconds


def measure_gemm_peak(device: torch.device | str, dtype: torch.dtype, size: int = 0) -> float:
    """Flops per second of a square ``size``-by-``size`` matmul in ``dtype`` (default 2048
    on a CPU, 8192 on a GPU): the fastest of ``PASSES`` after a warm-up (the first bfloat16
    product ran at a seventh of the later ones' speed on 2 cores)."""
    device = torch.device(device)
    size = size or (CUDA_GEMM_SIZE if device.type == "cuda" else CPU_GEMM_SIZE)
    generator = torch.Generator().manual_seed(0)
    a, b = (torch.randn(size, size, generator=generator).to(device, dtype) for _ in range(2))
    return 2 * size**3 / _fastest(lambda: a @ b, device)


def _fastest(work: Callable[[], object], device: torch.device) -> float:
    times = []
    for _ in range(PASSES + 1):
        start = time.perf_counter()
        work()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return min(times[1:])


def _free_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    import psutil

    return psutil.virtual_memory().available


def _linear_weights(runner: Runner) -> list[torch.Tensor]:
    """Every weight one forward streams: the model's Linear weights, the lm_head's among
    them; each once (a lm_head tied to the embedding is one tensor). The embedding is a
    lookup of n rows, not a stream, so it counts only as the lm_head's weight if tied."""
    seen: dict[int, torch.Tensor] = {}
    for module in runner.model.modules():
        if isinstance(module, torch.nn.Linear):
            seen.setdefault(id(module.weight), module.weight)
    return list(seen.values())


def weight_bytes(runner: Runner) -> int:
    return sum(w.numel() * w.element_size() for w in _linear_weights(runner))


def linear_params(runner: Runner) -> int:
    return sum(w.numel() for w in _linear_weights(runner))


@dataclass
class Roofline:
    bandwidth: float  # bytes/s
    gemm_peak: float  # flop/s
    weight_bytes: int
    params: int  # of the Linear weights: 2 flops each per token

    def floor(self, n: int) -> float:
        """Seconds one forward over ``n`` tokens cannot beat here."""
        return max(self.weight_bytes / self.bandwidth, 2 * self.params * n / self.gemm_peak)

    def knee(self) -> float:
        """The n past which the floor is the GEMM's, not the memory's."""
        return self.weight_bytes * self.gemm_peak / (self.bandwidth * 2 * self.params)

    def ratios(self, seconds: Sequence[float]) -> list[float]:
        """``seconds[n - 1]`` (a verify curve) over the floor of n."""
        return [s / self.floor(n) for n, s in enumerate(seconds, 1)]

    def formula(self) -> str:
        return (
            f"floor = max({self.weight_bytes / 1e6:.0f} MB / {self.bandwidth / 1e9:.1f} GB/s, "
            f"2 x {self.params / 1e6:.1f} M params x n / {self.gemm_peak / 1e9:.0f} GFLOP/s)"
        )

    def summary(self) -> dict:
        """The roofline's numbers in the units people read."""
        return {
            "bandwidth_gb_s": round(self.bandwidth / 1e9, 2),
            "gemm_gflop_s": round(self.gemm_peak / 1e9, 1),
            "weight_mb": round(self.weight_bytes / 1e6, 1),
            "params_m": round(self.params / 1e6, 2),
        }


def measure_roofline(runner: Runner, quick: bool = False) -> Roofline:
    """This machine's roofline for ``runner``'s model in its dtype. ``quick``: the smaller
    sizes a profile run can afford (~0.3 s on 2 cores)."""
    device = runner.device
    small = quick and device.type == "cpu"
    return Roofline(
        bandwidth=measure_bandwidth(device, QUICK_BANDWIDTH_BYTES if quick else BANDWIDTH_BYTES),
        gemm_peak=measure_gemm_peak(device, runner.dtype, QUICK_CPU_GEMM_SIZE if small else 0),
        weight_bytes=weight_bytes(runner),
        params=linear_params(runner),
    )


def verify_record(curve: LatencyCurve, roofline: Roofline) -> dict:
    """What a method's profile block records of the verify curve it was tuned on: its cost
    relative to one token, and its ratio to this machine's floor (with the floor's numbers)."""
    return {
        "verify_cost_relative": [round(v, 3) for v in curve.relative()],
        "verify_floor_ratio": [round(v, 3) for v in roofline.ratios(curve.seconds)],
        "roofline": roofline.summary(),
    }
