"""The device models run on: which one (``--device``, ``--dtype``), and a description of
it for the measurements taken there."""

from __future__ import annotations

import hashlib
import os
import platform
import re
import sys

import torch

from autotune.errors import AutotuneError

DTYPES = ("float32", "bfloat16", "float16")
_DTYPE_SPELLINGS = {"fp32": "float32", "fp16": "float16", "half": "float16", "bf16": "bfloat16"}


def cuda_count() -> int:
    """GPUs torch can use here (0 on a CPU-only build or a machine without one)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def resolve_device(device: str) -> str:
    """``--device`` as a torch device: ``cpu`` or ``cuda:N``. ``auto`` is the first GPU when
    there is one, else the CPU; a GPU asked for and absent fails here, before any load."""
    text = device.strip().lower()
    count = cuda_count()
    if text == "auto":
        return "cuda:0" if count else "cpu"
    if text == "cpu":
        return "cpu"
    match = re.fullmatch(r"cuda(?::(\d+))?", text)
    if match is None:
        raise AutotuneError(f"unknown device '{device}': use auto, cpu, cuda or cuda:N")
    if count == 0:
        build = "a CPU-only build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}"
        raise AutotuneError(
            f"--device {device}: torch {torch.__version__} ({build}) sees no CUDA GPU on this "
            "machine; use --device cpu (or auto), or run on a machine with a GPU"
        )
    index = int(match[1] or 0)
    if index >= count:
        raise AutotuneError(
            f"--device {device}: this machine has {count} GPU{'s' if count > 1 else ''} "
            f"(cuda:0 to cuda:{count - 1}); choose one of them"
        )
    return f"cuda:{index}"


def resolve_dtype(dtype: str, device: str) -> str:
    """``--dtype`` for a resolved ``device``: ``auto`` is half precision on a GPU (bfloat16
    where it has it, else float16) and float32 on the CPU, where half precision computes
    correctly but usually no faster."""
    text = str(dtype).strip().lower().removeprefix("torch.")
    text = _DTYPE_SPELLINGS.get(text, text)
    on_gpu = device.startswith("cuda")
    if text == "auto":
        if not on_gpu:
            return "float32"
        return "bfloat16" if _bf16_on(device) else "float16"
    if text not in DTYPES:
        raise AutotuneError(f"unknown dtype '{dtype}': use auto, {', '.join(DTYPES)}")
    if text == "bfloat16" and on_gpu and not _bf16_on(device):
        raise AutotuneError(
            f"--dtype bfloat16: {torch.cuda.get_device_name(torch.device(device))} has no "
            "bfloat16 arithmetic; use --dtype float16 (or auto)"
        )
    return text


def _bf16_on(device: str) -> bool:
    with torch.cuda.device(torch.device(device)):
        try:  # emulated bfloat16 (pre-Ampere GPUs) computes, but slower than float16
            return torch.cuda.is_bf16_supported(including_emulation=False)
        except TypeError:  # torch before 2.3 has no such argument
            return torch.cuda.is_bf16_supported()


def process_device(device: str) -> str:
    """The device this process loads the model on, for ``device`` as the main process
    resolved it. A Ray trial that reserved GPUs uses the first of them, whichever GPU the
    main process named: Ray makes the reserved GPUs the only ones the trial sees."""
    if not device.startswith("cuda"):
        return device
    reserved = _ray_reserved_gpus()
    if not reserved:
        if cuda_count() == 0:  # the main process saw one: this is a worker Ray hid it from
            raise AutotuneError(
                f"the model runs on {device}, but this Ray trial sees no GPU (it reserved "
                "none, or its node has none): give trials a GPU with --gpus-per-trial"
            )
        return device
    if os.environ.get("RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"):
        # Ray left every GPU visible: the reserved id is an index into what is visible
        visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")]
        first = str(reserved[0])
        return f"cuda:{visible.index(first) if first in visible else int(first)}"
    return "cuda:0"


def _ray_reserved_gpus() -> list:
    """The GPU ids Ray reserved for this process: empty outside a Ray task or actor (the
    driver holds none) and where Ray is not in use."""
    ray = sys.modules.get("ray")  # never imported here: a process Ray runs has it already
    if ray is None or not ray.is_initialized():
        return []
    return list(ray.get_runtime_context().get_accelerator_ids().get("GPU", []))


def describe(device: str = "cpu") -> dict:
    if device.startswith("cuda") and torch.cuda.is_available():
        name = torch.cuda.get_device_name(torch.device(device))
    else:
        name = _cpu_name()
    return {
        "device": device,
        "device_name": name,
        "threads": torch.get_num_threads(),
        "cores": _cores(),
        "torch_version": torch.__version__,
    }


def key(info: dict, dtype: str) -> str:
    """Cached timings are keyed by this: they do not travel between devices, thread
    counts, dtypes or torch releases."""
    return (
        f"{info['device']}|{info['device_name']}|{info['threads']} threads|"
        f"{info.get('cores')} cores|{dtype}|torch {info['torch_version']}"
    )


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _cpu_name() -> str:
    line = _cpuinfo_line("model name")
    return _value(line) if line else platform.processor() or platform.machine()


def machine_key() -> dict:
    """What a measured kernel choice or a kernel compiled for this CPU depends on: the CPU
    (its name and a digest of its feature flags: virtual machines often name every CPU
    alike), the torch build, the threads."""
    name, flags = _cpuinfo_line("model name"), _cpuinfo_line("flags")
    digest = hashlib.sha256(flags.encode()).hexdigest()[:8] if flags else ""
    cpu = f"{_value(name) if name else platform.processor() or 'unknown'} {digest}".strip()
    return {
        "cpu": cpu,
        "machine": platform.machine(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }


def _cpuinfo_line(field: str) -> str | None:
    """The first line of /proc/cpuinfo that starts with ``field`` (None: none, or no file)."""
    try:
        with open("/proc/cpuinfo") as stream:
            for line in stream:
                if line.startswith(field):
                    return line.rstrip("\n")
    except OSError:
        pass
    return None


def _value(line: str) -> str:
    return line.split(":", 1)[1].strip()
