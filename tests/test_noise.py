"""A busy CPU: one torch thread is tried, and kept only where it is faster."""

from __future__ import annotations

import pytest
import torch

from autotune.engine import kernels
from autotune.measure import noise


class CpuRunner:
    device = torch.device("cpu")


def reading(ms: float, threads: int, busy: bool = True) -> noise.Reading:
    return noise.Reading(ms, 0.01, 2.9 if busy else 0.0, 2, threads, ["busy"] if busy else [])


@pytest.fixture
def threads_restored():
    kernels.read_only(False)
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)
    kernels.read_only(False)


@pytest.mark.parametrize(("one_thread_ms", "kept"), [(110.0, True), (300.0, True), (320.0, False)])
def test_one_thread_is_kept_only_when_clearly_faster(
    monkeypatch, threads_restored, one_thread_ms, kept
):
    monkeypatch.setattr(noise, "probe", lambda runner: reading(one_thread_ms, 1))
    torch.set_num_threads(2)
    found = noise.fewer_threads(CpuRunner(), reading(350.0, 2))
    assert (found is not None) == kept
    assert torch.get_num_threads() == (1 if kept else 2)
    assert kernels.table()._timing is (not kept)  # a kept single thread times no kernels


def test_a_quiet_machine_or_one_thread_is_left_alone(monkeypatch, threads_restored):
    def never(runner):
        raise AssertionError("probed")

    monkeypatch.setattr(noise, "probe", never)
    assert noise.fewer_threads(CpuRunner(), reading(30.0, 2, busy=False)) is None
    assert noise.fewer_threads(CpuRunner(), reading(300.0, 1)) is None
