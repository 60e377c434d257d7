"""A description of the device measurements were taken on."""

from __future__ import annotations

import platform

import torch


def describe(device: str = "cpu") -> dict:
    if device.startswith("cuda") and torch.cuda.is_available():
        name = torch.cuda.get_device_name(torch.device(device))
    else:
        name = _cpu_name()
    return {
        "device": device,
        "device_name": name,
        "threads": torch.get_num_threads(),
        "torch_version": torch.__version__,
    }


def key(info: dict) -> str:
    """Measurement caches are keyed by this: timings do not travel between devices."""
    return f"{info['device']}|{info['device_name']}|{info['threads']}"


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as stream:
            for line in stream:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
