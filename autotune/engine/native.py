"""The engine's C++ code, built for this CPU: a float32 product for a few rows
(``small_gemm.cpp``) and the decoder layers of a LLaMA-family model (``decoder.cpp``).

torch's CPU kernels are near the memory floor for one row, but from about 3 rows on they
re-pack the weight on every call: on a 2-core Xeon, SmolLM2-135M's products over 8 rows
took 45 ms where one row took 21 ms (the weights alone stream in 21 ms). The kernel here
reads each weight once per call for up to 64 rows (8 rows: 26 ms on that machine), and a
row's result does not depend on how many rows share the call. The decoder layers run
between those products without the per-operation overhead of ~35 torch calls a layer.

It is compiled once per machine and checkout with the C++ compiler torch's extensions use
(about 20 s), into torch's extension folder (``$TORCH_EXTENSIONS_DIR``, by default
``~/.cache/torch_extensions``), which every autotune process and trial worker shares, one
process building at a time (``_building``). With
no compiler, or ``AUTOTUNE_NATIVE=0``, the engine keeps torch's kernels and its Python
layers.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import os
import shutil
import struct
import sys
import time
from pathlib import Path
from typing import Any

import torch

from autotune.hardware import machine_key

_HERE = Path(__file__).parent
SOURCES = tuple(
    _HERE / name for name in ("small_gemm.cpp", "decoder.cpp", "huge_pages.cpp", "bindings.cpp")
)
HEADERS = (_HERE / "native.h",)
SWITCH_ENV = "AUTOTUNE_NATIVE"  # "0": never built or used

_module: Any = None
_tried = False


def available(build: bool = True) -> bool:
    """Whether the kernel can be used in this process; ``build=False`` uses a build that
    is already on disk but starts none (a busy machine)."""
    global _module, _tried
    if _module is not None:
        return True
    if _tried or os.environ.get(SWITCH_ENV, "1") == "0":
        return False
    if not build and not _built_file().is_file():
        return False
    _tried = True
    _module = _load()
    return _module is not None


def product(x2d: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x2d @ weight.T`` for float32 ``x2d`` [M, K] and a contiguous ``weight`` [N, K]."""
    # model weights are contiguous; a view of one (a slice of a fused weight) is copied
    return _module.small_linear(x2d, weight if weight.is_contiguous() else weight.contiguous())


def huge_page_copies(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Copies of contiguous CPU tensors in one block of memory asked to be backed by 2 MiB
    pages (``huge_pages.cpp``)."""
    return _module.huge_page_copies(tensors)


def decoder_stack(
    weights: list[torch.Tensor], q_heads: int, kv_heads: int, head_dim: int, eps: float
) -> Any:
    """The C++ ``DecoderStack`` over these weights (seven a layer, see ``engine.stack``)."""
    return _module.DecoderStack(weights, q_heads, kv_heads, head_dim, eps)


@functools.cache
def _name() -> str:
    """One build per source, compiler target, torch and checkout: ``-march=native`` code
    runs only on the CPU it was built for, and ninja's build file names the sources by
    their paths (two checkouts sharing a folder rebuilt it in turn, each over the other's)."""
    code = "".join(path.read_text() for path in (*SOURCES, *HEADERS))
    key = {**machine_key(), "threads": None, "source": code, "where": str(_HERE)}
    return "autotune_native_" + hashlib.sha256(repr(sorted(key.items())).encode()).hexdigest()[:12]


def _folder() -> Path:
    from torch.utils.cpp_extension import get_default_build_root

    # torch's own builds honour $TORCH_EXTENSIONS_DIR, but get_default_build_root does not
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root()
    return Path(root) / _name()


def _built_file() -> Path:
    return _folder() / f"{_name()}.so"


def _load() -> Any:
    folder = _folder()
    # torch finds ninja on PATH: pip's ninja sits beside this interpreter, which a
    # virtual environment run without activation does not put on PATH
    here = str(Path(sys.executable).parent)
    if shutil.which("ninja") is None and here not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = here + os.pathsep + os.environ.get("PATH", "")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        _say_unusable(folder, exc)
        return None
    return _build(folder)


def _build(folder: Path) -> Any:
    """The module, built in ``folder`` unless built there already; None when it cannot be
    (no compiler, a failed build, another process's build for too long): torch's
    kernels, which are correct, only slower."""
    from torch.utils.cpp_extension import load

    from autotune.progress import say

    try:
        with _building(folder):
            _set_aside_if_cut_short(_built_file())
            if not _built_file().is_file():
                say("[dim]building the engine's C++ code for this CPU (once, about 20 s)[/dim]")
            # the compiler's own output is not the user's business
            with (
                contextlib.redirect_stdout(io.StringIO()),
                contextlib.redirect_stderr(io.StringIO()),
            ):
                return load(
                    name=_name(),
                    sources=[str(path) for path in SOURCES],
                    extra_cflags=["-O3", "-march=native", "-fopenmp", f"-I{_HERE}"],
                    extra_ldflags=["-fopenmp"],
                    build_directory=str(folder),
                    verbose=False,
                )
    except Exception:  # no compiler, a failed build, an unwritable folder, a long wait
        return None


def _set_aside_if_cut_short(library: Path) -> None:
    """A library a build killed while linking left cut short is moved aside: ninja sees
    it newer than the sources and would never build it again."""
    if library.is_file() and _cut_short(library):
        from autotune.cache_entry import CacheEntry

        CacheEntry(library, "the engine's C++ build").discard(
            f"{library.name} is cut short", "building it again"
        )


def _say_unusable(folder: Path, exc: OSError) -> None:
    """One line: the build folder cannot be made, so the engine runs slower."""
    from autotune.files import reason
    from autotune.progress import console

    console.print(
        f"warning: cannot build the engine's C++ code in {folder}: {reason(exc)}; using "
        "torch's kernels (slower): set TORCH_EXTENSIONS_DIR to a folder autotune can write",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )


def _cut_short(library: Path) -> bool:
    """Whether a built shared library ends before its ELF section headers do (what a
    build killed while linking leaves)."""
    try:
        with library.open("rb") as f:
            head = f.read(64)
        size = library.stat().st_size
    except OSError:
        return False
    if len(head) < 64 or head[:4] != b"\x7fELF":
        return True  # not even its header: cut short, or not a library at all
    if head[4] != 2:
        return False  # a 32-bit library: its header is laid out otherwise, not checked
    order = "<" if head[5] == 1 else ">"
    (section_headers,) = struct.unpack_from(order + "Q", head, 0x28)
    entry_size, count = struct.unpack_from(order + "HH", head, 0x3A)
    return section_headers + entry_size * count > size


# another process's build takes about 20 s, several minutes on a busy machine
BUILD_WAIT_S = 300.0


@contextlib.contextmanager
def _building(folder: Path):
    """Held while this process builds or loads the module in ``folder``, one process at a
    time. torch's own build lock is a file, which a build killed midway (a time limit,
    Ctrl-C) leaves behind, and every later process then waits on it forever. This hold is
    the kernel's (``flock``), released when its process ends however it ends; every
    builder takes it first, so a ``lock`` file found while holding it is a killed build's,
    and is removed. Raises TimeoutError after ``BUILD_WAIT_S`` of another's build."""
    import fcntl

    with (folder / "build.flock").open("a") as handle:
        deadline = time.monotonic() + BUILD_WAIT_S
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"another process builds in {folder}") from None
                time.sleep(0.2)
        try:
            (folder / "lock").unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
