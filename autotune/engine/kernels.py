"""Which CPU kernel multiplies a few rows by a weight fastest, measured on this machine.

A decode or verify step multiplies 1 to a few dozen rows by every weight. Which kernel is
fastest for that depends on the CPU, the torch build, the thread count, the weight's shape
and the row count: ``x @ W.T`` (``F.linear``, a matrix-vector kernel for one row),
``W @ x.T`` (the multithreaded GEMM, given at least two columns) and, in float32 where it
could be built, the engine's own ``small`` kernel (``engine.native``). Measured on two
2-core machines of this project: one ran a SmolLM2-135M one-token forward in 33 ms by
``W @ x.T`` (``F.linear`` was single-threaded there); another in 30 ms by ``F.linear`` and
64 ms by ``W @ x.T``. So the choice is measured, per weight shape and row count, once per
machine (kept in autotune's cache), with the weights streamed from memory as in a real
forward (copies cycled through, so that a small weight is not timed hot in the CPU's cache).

Plain and speculative decoding go through the same table, so their ratio stays fair.

A run on a busy machine times nothing here (``read_only``): timings beside other work
are neither reliable nor cheap (2 cores beside three CPU hogs: 60 s for one thread
count's table, a fifth of a 5-minute budget), so shapes without a record take
``F.linear``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
import torch.nn.functional as F

from autotune.cache_entry import CacheEntry
from autotune.engine import native
from autotune.hardware import machine_key

# Row counts that are measured; a count between two takes the larger one's choice.
ROWS = (*range(1, 17), 20, 24, 28, 32, 40, 48, 56, 64)
SMALL_ROWS = ROWS[-1]  # more rows than this: F.linear, the GEMM path for any kernel
# Bytes of weight copies cycled through while timing a shape: more than a CPU's cache
# (at most MAX_COPIES copies: a tiny model's weights stay in the cache when it runs too).
STREAM_BYTES = 96 * 2**20
MAX_COPIES = 64
REPEATS = 3  # the fastest of this many passes over the copies counts
# Set (by ``read_only``) in a run on a busy machine; its trial workers inherit it.
READ_ONLY_ENV = "AUTOTUNE_KERNELS_READ_ONLY"
LINEAR, TRANSPOSED, SMALL = "linear", "transposed", "small"
# The small kernel is kept when within this factor of the fastest: its rows never depend on
# how many share a call, so a verify pass scores each token exactly as a one-token step does.
SMALL_KEPT_WITHIN = 1.05

Shape = tuple[str, int, int]  # dtype, out features, in features
_LINEAR = (LINEAR,) * len(ROWS)  # F.linear at every row count
# (kernel name, rows, the work) -> seconds: the clock, or a stand-in in tests
Timer = Callable[[str, int, Callable[[], object]], float]


def padded_rows(rows: int) -> int:
    """Columns ``W @ x.T`` is given for ``rows`` rows: one column falls back to the slow
    kernel, and counts past 8 that are not a multiple of 8 took longer than the next
    multiple of 8 (measured on 2 cores)."""
    if rows == 1:
        return 2
    return rows if rows <= 8 else -(-rows // 8) * 8


def transposed_product(x2d: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x2d @ weight.T`` as ``weight @ x2d.T``, rows padded (see ``padded_rows``)."""
    rows = x2d.shape[0]
    padded = padded_rows(rows)
    if padded != rows:
        x2d = torch.cat([x2d, x2d.new_zeros(padded - rows, x2d.shape[1])])
    else:
        x2d = x2d.contiguous()  # row-major: ``x2d.T`` is the view the fast kernel takes
    return (weight @ x2d.T).T[:rows].contiguous()


class KernelTable:
    """For each weight shape, the kernel (LINEAR, TRANSPOSED or SMALL) each row count
    takes; shapes not measured yet are measured on first use."""

    def __init__(self, timer: Timer | None = None, store: Path | None = None, timing: bool = True):
        self._timer = timer or _fastest_pass
        self._store = store
        self._timing = timing  # False: record only, F.linear for shapes not on it
        self._choices: dict[Shape, tuple[str, ...]] = {}
        # by weight tensor (id): a forward asks ~200 times, so the shape's key is built
        # once per weight; the shape is checked, as a freed weight's id is reused by others
        # (another shape's choice gave other bits: a saved head no longer matched itself)
        self._by_weight: dict[int, tuple[tuple[int, ...], torch.dtype, tuple[str, ...]]] = {}
        self._loaded = False

    def kernel(self, weight: torch.Tensor, rows: int) -> str:
        """The kernel ``rows`` rows (1 .. SMALL_ROWS) take with this weight."""
        known = self._by_weight.get(id(weight))
        if known is None or known[0] != weight.shape or known[1] != weight.dtype:
            choices = self.measure([weight]).get(_shape(weight), _LINEAR)
            known = self._by_weight[id(weight)] = (tuple(weight.shape), weight.dtype, choices)
        choice = known[2][_ROW_INDEX[rows]]
        # asked at every product, not once per weight: a choice kept while the kernel was
        # loaded outlived a runner told to go without it (a weight's id is reused, and a
        # trace of a step, blind to the C++ call, froze its product's output)
        if choice == SMALL and not native.available(build=self._timing):
            return LINEAR
        return choice

    def measure(self, weights: Iterable[torch.Tensor]) -> dict[Shape, tuple[str, ...]]:
        """The choices for these weights' shapes: from this machine's record where it has
        them, else timed now (and recorded)."""
        self._load()
        if not self._timing:
            return dict(self._choices)
        new = {}
        for weight in weights:
            shape = _shape(weight)
            if shape not in self._choices:
                self._choices[shape] = new[shape] = self._time_shape(weight)
        if new:
            self._save()
        return dict(self._choices)

    def _time_shape(self, weight: torch.Tensor) -> tuple[str, ...]:
        in_features = weight.shape[1]
        size = weight.numel() * weight.element_size()
        count = min(MAX_COPIES, max(1, STREAM_BYTES // size))
        copies = [weight.detach().clone() for _ in range(count - 1)]
        pool = [weight.detach(), *copies]
        products: dict[str, Callable] = {LINEAR: F.linear, TRANSPOSED: transposed_product}
        if weight.dtype == torch.float32 and native.available():
            products[SMALL] = native.product
        choices = []
        with torch.inference_mode():
            for rows in ROWS:
                x = torch.randn(rows, in_features, dtype=weight.dtype, device=weight.device)
                seconds = {
                    name: self._timer(name, rows, functools.partial(_each, product, x, pool))
                    for name, product in products.items()
                }
                fastest = min(seconds, key=seconds.__getitem__)
                if SMALL in seconds and seconds[SMALL] <= SMALL_KEPT_WITHIN * seconds[fastest]:
                    fastest = SMALL
                choices.append(fastest)
        return tuple(choices)

    def _load(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        entry = self._entry()
        if entry is None or not entry.usable():
            return
        try:
            record = json.loads(entry.path.read_text())
            for key, choices in record["choices"].items():
                dtype, out_features, in_features = key.split(":")
                if len(choices) == len(ROWS) and set(choices) <= {LINEAR, TRANSPOSED, SMALL}:
                    shape = (dtype, int(out_features), int(in_features))
                    self._choices[shape] = tuple(choices)
        except (OSError, ValueError, KeyError, AttributeError) as exc:
            self._choices.clear()
            entry.discard(f"unreadable: {type(exc).__name__}", "measuring the kernels again")
            return
        entry.loaded()

    def _save(self) -> None:
        entry = self._entry()
        if entry is None:
            return
        record = {
            "machine": machine_key(),
            "rows": list(ROWS),
            "choices": {":".join(map(str, shape)): list(c) for shape, c in self._choices.items()},
        }
        entry.write_bytes(json.dumps(record, indent=1).encode())

    def _entry(self) -> CacheEntry | None:
        if self._store is None:
            return None
        return CacheEntry(self._store, "this machine's kernel table")


def _store_path() -> Path:
    from autotune.paths import cache_root

    digest = hashlib.sha256(json.dumps(machine_key(), sort_keys=True).encode()).hexdigest()
    return cache_root() / "kernels" / f"{digest[:16]}.json"


def _shape(weight: torch.Tensor) -> Shape:
    return (str(weight.dtype).removeprefix("torch."), weight.shape[0], weight.shape[1])


# row count -> index into ROWS of the smallest measured count at least as large
_ROW_INDEX = [0] + [next(i for i, m in enumerate(ROWS) if m >= r) for r in range(1, SMALL_ROWS + 1)]


def _each(product: Callable, x: torch.Tensor, pool: list[torch.Tensor]) -> None:
    for weight in pool:
        product(x, weight)


def _fastest_pass(kernel: str, rows: int, run: Callable[[], object]) -> float:
    run()  # warm-up: allocations, first touches
    best = float("inf")
    for _ in range(REPEATS):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


# by torch thread count and whether it may time, this process's
_TABLES: dict[tuple[int, bool], KernelTable] = {}
# read once here and kept by ``read_only``: ``table()`` runs for every product of every
# forward, where reading the environment would cost 0.65 us a call
_read_only = bool(os.environ.get(READ_ONLY_ENV))


def table() -> KernelTable:
    """This process's table for its current thread count (kept on disk per machine)."""
    key = (torch.get_num_threads(), not _read_only)
    found = _TABLES.get(key)
    if found is None:
        found = _TABLES[key] = KernelTable(store=_store_path(), timing=key[1])
    return found


def read_only(on: bool = True) -> None:
    """From now on, in this process and the trial workers it starts, kernel choices are
    read from this machine's record, never timed (a busy machine); ``on=False`` undoes it."""
    global _read_only
    _read_only = on
    if on:
        os.environ[READ_ONLY_ENV] = "1"  # for the processes it starts
    else:
        os.environ.pop(READ_ONLY_ENV, None)


os.register_at_fork(after_in_child=_TABLES.clear)  # a child measures under its own threads
