"""What a measured kernel choice or a compiled kernel depends on: this CPU, torch, threads."""

from __future__ import annotations

import hashlib
import platform
from pathlib import Path

import torch


def machine_key() -> dict:
    """What the choice depends on: the CPU, the torch build, the threads."""
    return {
        "cpu": cpu_name(),
        "machine": platform.machine(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }


def cpu_name() -> str:
    """The CPU's model name and a digest of its feature flags (virtual machines often
    name every CPU alike)."""
    name, flags = platform.processor() or "unknown", ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = hashlib.sha256(line.encode()).hexdigest()[:8]
    except OSError:
        pass
    return f"{name} {flags}".strip()
