"""The kernel table: which CPU product a weight takes for a row count, measured once per
machine and kept; every product gives the same result, the engine's own one row by row
whatever the row count."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from autotune.engine import kernels, layers, native


def timer_preferring_transposed_from(rows_at_least: int):
    """A stand-in for the clock: the transposed product is 'faster' from this many rows
    on (the small kernel, where it is built, slowest of all)."""
    calls = []

    def timer(kernel: str, rows: int, run) -> float:
        calls.append(rows)
        if kernel == kernels.SMALL:
            return 3.0
        faster = (kernel == kernels.TRANSPOSED) == (rows >= rows_at_least)
        return 1.0 if faster else 2.0

    return timer, calls


def transposed(table: kernels.KernelTable, weight: torch.Tensor, rows: int) -> bool:
    return table.kernel(weight, rows) == kernels.TRANSPOSED


def test_the_table_follows_the_measured_times_and_rounds_rows_up():
    timer, _ = timer_preferring_transposed_from(12)
    table = kernels.KernelTable(timer=timer)
    weight = torch.randn(24, 16)
    assert [transposed(table, weight, r) for r in (1, 4, 11)] == [False, False, False]
    assert [transposed(table, weight, r) for r in (12, 16, 17, 64)] == [True] * 4


def test_a_recorded_table_is_read_back_without_timing(tmp_path):
    store = tmp_path / "kernels.json"
    timer, calls = timer_preferring_transposed_from(5)
    weight = torch.randn(8, 16)
    kernels.KernelTable(timer=timer, store=store).measure([weight])
    assert calls and json.loads(store.read_text())["rows"] == list(kernels.ROWS)
    timed = len(calls)
    again = kernels.KernelTable(timer=timer, store=store)
    assert transposed(again, weight, 5) and not transposed(again, weight, 4)
    assert len(calls) == timed  # nothing timed: the record answered


def test_an_unreadable_record_is_measured_again(tmp_path):
    store = tmp_path / "kernels.json"
    store.write_text("{not json")
    timer, calls = timer_preferring_transposed_from(1)
    assert transposed(kernels.KernelTable(timer=timer, store=store), torch.randn(4, 4), 3)
    assert calls
    assert json.loads(store.read_text())["choices"]  # rewritten whole


@pytest.mark.parametrize("rows", [1, 2, 3, 8, 9, 17, 64, 65])
@pytest.mark.parametrize("kernel", [kernels.LINEAR, kernels.TRANSPOSED, kernels.SMALL])
def test_every_product_equals_torch_linear(monkeypatch, rows, kernel):
    if kernel == kernels.SMALL and not native.available():
        pytest.skip("the engine's own kernel could not be built here (no C++ compiler?)")
    torch.manual_seed(rows)
    module = torch.nn.Linear(40, 50)  # neither a multiple of the kernel's 16 lanes
    table = kernels.KernelTable(timer=lambda kernel, rows, run: 1.0)
    table._choices[kernels._shape(module.weight)] = (kernel,) * len(kernels.ROWS)
    monkeypatch.setattr(kernels, "table", lambda: table)
    x = torch.randn(1, rows, 40)
    with torch.inference_mode():
        got = layers.linear(x, module)
        assert got.shape == (1, rows, 50)
        torch.testing.assert_close(got, F.linear(x, module.weight, module.bias))


def test_a_read_only_table_times_nothing_and_takes_linear_off_the_record(tmp_path):
    store = tmp_path / "kernels.json"
    timer, calls = timer_preferring_transposed_from(1)
    recorded, other = torch.randn(8, 16), torch.randn(12, 16)
    kernels.KernelTable(timer=timer, store=store).measure([recorded])
    timed = len(calls)
    busy = kernels.KernelTable(timer=timer, store=store, timing=False)
    assert transposed(busy, recorded, 3)  # the record still answers
    assert busy.kernel(other, 3) == kernels.LINEAR  # no record: F.linear, nothing timed
    assert len(calls) == timed
    assert "12:16" not in store.read_text()


def test_read_only_reaches_the_table_and_its_workers_and_is_undone():
    kernels.read_only(False)
    try:
        kernels.read_only()
        assert kernels.table()._timing is False
        assert os.environ.get(kernels.READ_ONLY_ENV)  # what trial workers inherit
    finally:
        kernels.read_only(False)
    assert kernels.table()._timing is True
    assert kernels.READ_ONLY_ENV not in os.environ


def test_the_small_kernel_is_kept_when_nearly_fastest():
    """Within SMALL_KEPT_WITHIN of the fastest, the small kernel wins: a verify pass then
    scores every token exactly as a one-token step does."""
    if not native.available():
        pytest.skip("the engine's own kernel could not be built here (no C++ compiler?)")

    def timer(kernel: str, rows: int, run) -> float:
        return {kernels.LINEAR: 1.0, kernels.TRANSPOSED: 1.5, kernels.SMALL: 1.04}[kernel]

    table = kernels.KernelTable(timer=timer)
    assert table.kernel(torch.randn(24, 16), 3) == kernels.SMALL

    def slower(kernel: str, rows: int, run) -> float:
        return {kernels.LINEAR: 1.0, kernels.TRANSPOSED: 1.5, kernels.SMALL: 1.2}[kernel]

    assert kernels.KernelTable(timer=slower).kernel(torch.randn(24, 16), 3) == kernels.LINEAR


def test_a_record_of_another_format_is_measured_again(tmp_path):
    """Records written before the small kernel held booleans: not read as kernel names."""
    store = tmp_path / "kernels.json"
    rows = [True] * len(kernels.ROWS)
    store.write_text(json.dumps({"rows": list(kernels.ROWS), "choices": {"float32:8:16": rows}}))
    timer, calls = timer_preferring_transposed_from(100)
    assert kernels.KernelTable(timer=timer, store=store).kernel(torch.randn(8, 16), 3) == "linear"
    assert calls


@pytest.mark.skipif(not native.available(), reason="no C++ compiler for the engine's kernel")
def test_the_small_kernel_gives_a_row_the_same_bits_in_any_batch():
    """What makes it lossless-friendly: row i of an M-row product is bit for bit the
    one-row product of row i, for every M the engine verifies (1..64)."""
    torch.manual_seed(0)
    weight = torch.randn(70, 75)
    x = torch.randn(64, 75)
    alone = torch.cat([native.product(x[i : i + 1], weight) for i in range(64)])
    for rows in (2, 5, 8, 9, 16, 33, 64):
        assert torch.equal(native.product(x[:rows], weight), alone[:rows])


@pytest.mark.skipif(not native.available(), reason="no C++ compiler for the engine's kernel")
def test_the_small_kernel_counts_subnormal_inputs_as_zero():
    """Subnormal activations made one verify pass 60x slower; they count as zero (as in
    torch's own kernels), and the product stays right for the normal part."""
    weight = torch.randn(32, 48)
    x = torch.randn(4, 48)
    x[:, ::2] = 1e-41  # subnormal in float32
    expected = F.linear(torch.where(x.abs() < 1e-38, torch.zeros_like(x), x), weight)
    torch.testing.assert_close(native.product(x, weight), expected)


def test_without_the_engines_kernel_the_table_chooses_among_torchs(monkeypatch):
    """No compiler, or AUTOTUNE_NATIVE=0: the engine's kernel is never timed nor used,
    and a recorded choice of it reads as F.linear."""
    monkeypatch.setattr(native, "_module", None)
    monkeypatch.setattr(native, "_tried", False)
    monkeypatch.setenv(native.SWITCH_ENV, "0")
    timed = set()

    def timer(kernel: str, rows: int, run) -> float:
        timed.add(kernel)
        return 1.0

    weight = torch.randn(24, 16)
    table = kernels.KernelTable(timer=timer)
    assert table.kernel(weight, 3) == kernels.LINEAR
    assert timed == {kernels.LINEAR, kernels.TRANSPOSED}
    recorded = kernels.KernelTable(timer=timer)
    recorded._choices[kernels._shape(weight)] = (kernels.SMALL,) * len(kernels.ROWS)
    assert recorded.kernel(weight, 3) == kernels.LINEAR


def test_a_reused_weight_id_does_not_take_another_shapes_choice():
    """A freed weight's id is reused by new tensors: the choice follows the shape."""

    def timer(kernel: str, rows: int, run) -> float:
        return 1.0 if kernel == kernels.TRANSPOSED else 2.0

    table = kernels.KernelTable(timer=timer)
    weight = torch.randn(24, 16)
    # as if a freed (8, 4) weight had held this id and been recorded as taking F.linear
    table._by_weight[id(weight)] = ((8, 4), torch.float32, kernels._LINEAR)
    assert table.kernel(weight, 3) == kernels.TRANSPOSED


def test_a_weight_that_took_the_engines_kernel_goes_without_it_once_it_is_unavailable(
    monkeypatch,
):
    """A choice is kept per weight, but whether the engine's kernel may run is asked at
    every product: a runner told to go without it (a trace of its steps cannot see the
    C++ call) once took it for a weight whose id an earlier weight had held."""
    table = kernels.KernelTable(timer=lambda kernel, rows, run: 1.0)
    weight = torch.randn(24, 16)
    table._choices[kernels._shape(weight)] = (kernels.SMALL,) * len(kernels.ROWS)
    monkeypatch.setattr(native, "available", lambda build=True: True)
    assert table.kernel(weight, 3) == kernels.SMALL
    monkeypatch.setattr(native, "available", lambda build=True: False)
    assert table.kernel(weight, 3) == kernels.LINEAR


def test_the_kernel_is_built_under_torch_extensions_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    assert native._folder().parent == tmp_path


def hold_the_build(folder: Path) -> subprocess.Popen:
    """Another process building in ``folder``: it holds the build's hold until killed."""
    script = (
        "import fcntl, sys, time; f = open(sys.argv[1], 'a'); "
        "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", script, str(folder / "build.flock")],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


def test_a_build_lock_a_killed_build_left_is_removed_and_a_live_builders_kept(
    monkeypatch, tmp_path
):
    """torch waits forever on a ``lock`` file that a build killed midway left (a check
    step's time limit did so, and every later process of the same checkout hung). Under
    the kernel's hold, which a killed process gives up, such a file is a leftover."""
    folder = tmp_path / "build"
    folder.mkdir()
    built = []

    def load(**options):
        built.append((folder / "lock").exists())
        return "module"

    monkeypatch.setattr("torch.utils.cpp_extension.load", load)
    monkeypatch.setattr(native, "BUILD_WAIT_S", 0.5)
    (folder / "lock").touch()
    holder = hold_the_build(folder)
    try:  # a live builder: its lock is kept, and the wait ends (torch's kernels)
        started = time.monotonic()
        assert native._build(folder) is None and built == []
        assert (folder / "lock").exists() and time.monotonic() - started < 5
    finally:
        holder.kill()
        holder.wait()
    # killed while building: its lock is a leftover, removed before the build
    assert native._build(folder) == "module" and built == [False]
