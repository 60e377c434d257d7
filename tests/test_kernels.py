"""The kernel table: which CPU product a weight takes for a row count, measured once per
machine and kept; both products give the same result."""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.nn.functional as F

from autotune.engine import kernels, layers


def timer_preferring_transposed_from(rows_at_least: int):
    """A stand-in for the clock: the transposed product is 'faster' from this many rows
    on."""
    calls = []

    def timer(kernel: str, rows: int, run) -> float:
        calls.append(rows)
        faster = (kernel == "transposed") == (rows >= rows_at_least)
        return 1.0 if faster else 2.0

    return timer, calls


def test_the_table_follows_the_measured_times_and_rounds_rows_up():
    timer, _ = timer_preferring_transposed_from(12)
    table = kernels.KernelTable(timer=timer)
    weight = torch.randn(24, 16)
    assert [table.transposed(weight, r) for r in (1, 4, 11)] == [False, False, False]
    assert [table.transposed(weight, r) for r in (12, 16, 17, 64)] == [True] * 4


def test_a_recorded_table_is_read_back_without_timing(tmp_path):
    store = tmp_path / "kernels.json"
    timer, calls = timer_preferring_transposed_from(5)
    weight = torch.randn(8, 16)
    kernels.KernelTable(timer=timer, store=store).measure([weight])
    assert calls and json.loads(store.read_text())["rows"] == list(kernels.ROWS)
    timed = len(calls)
    again = kernels.KernelTable(timer=timer, store=store)
    assert again.transposed(weight, 5) and not again.transposed(weight, 4)
    assert len(calls) == timed  # nothing timed: the record answered


def test_an_unreadable_record_is_measured_again(tmp_path):
    store = tmp_path / "kernels.json"
    store.write_text("{not json")
    timer, calls = timer_preferring_transposed_from(1)
    assert kernels.KernelTable(timer=timer, store=store).transposed(torch.randn(4, 4), 3)
    assert calls
    assert json.loads(store.read_text())["choices"]  # rewritten whole


@pytest.mark.parametrize("rows", [1, 2, 3, 8, 9, 17, 64, 65])
@pytest.mark.parametrize("transposed", [False, True])
def test_both_products_equal_torch_linear(monkeypatch, rows, transposed):
    torch.manual_seed(rows)
    module = torch.nn.Linear(32, 48)
    table = kernels.KernelTable(timer=lambda kernel, rows, run: 1.0)
    table._choices[kernels._shape(module.weight)] = (transposed,) * len(kernels.ROWS)
    monkeypatch.setattr(kernels, "table", lambda: table)
    x = torch.randn(1, rows, 32)
    with torch.inference_mode():
        got = layers.linear(x, module)
        assert got.shape == (1, rows, 48)
        torch.testing.assert_close(got, F.linear(x, module.weight, module.bias))


def test_a_read_only_table_times_nothing_and_takes_linear_off_the_record(tmp_path):
    store = tmp_path / "kernels.json"
    timer, calls = timer_preferring_transposed_from(1)
    recorded, other = torch.randn(8, 16), torch.randn(12, 16)
    kernels.KernelTable(timer=timer, store=store).measure([recorded])
    timed = len(calls)
    busy = kernels.KernelTable(timer=timer, store=store, timing=False)
    assert busy.transposed(recorded, 3)  # the record still answers
    assert not busy.transposed(other, 3)  # no record: F.linear, and nothing timed
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
