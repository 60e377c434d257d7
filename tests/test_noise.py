"""The noise check: a busy CPU is seen (other processes' load, forwards that vary again), a
quiet one is not called busy, and one torch thread is tried and kept only where faster."""

from __future__ import annotations

import multiprocessing

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


# Identical forwards of 30 ms, in seconds: one round varying by 10% (MAD / median), one
# varying by under 2%.
NOISY = [0.030, 0.033, 0.027, 0.030, 0.036, 0.024]
QUIET = [0.030, 0.0305, 0.0295, 0.030, 0.0301, 0.0299]


def probed(monkeypatch, rounds: list[list[float]], others: float = 0.0) -> noise.Reading:
    """A 6-forward probe (a phase's) on a machine whose rounds of forwards time as given."""
    timed = iter(rounds)
    monkeypatch.setattr(noise, "other_load", lambda: others)
    monkeypatch.setattr(noise, "forward_times", lambda runner, forwards: next(timed))
    monkeypatch.setattr(noise, "available_cores", lambda: 2)
    return noise.probe(CpuRunner(), forwards=len(rounds[0]))


def test_one_noisy_round_is_timed_again_and_not_busy_when_it_does_not_repeat(
    monkeypatch, threads_restored
):
    torch.set_num_threads(2)
    reading = probed(monkeypatch, [NOISY, QUIET])
    assert not reading.busy and reading.rounds == 2
    assert reading.spread < noise.BUSY_SPREAD  # the variation that repeated
    assert reading.as_dict()["busy"] is False


def test_noise_that_repeats_or_comes_with_others_load_is_busy(monkeypatch, threads_restored):
    torch.set_num_threads(2)
    repeated = probed(monkeypatch, [NOISY, NOISY])
    assert repeated.reasons == ["identical forwards vary by 10%"] and repeated.rounds == 2
    # other processes' load is evidence in itself: no second round is timed
    hogged = probed(monkeypatch, [NOISY], others=2.9)
    assert hogged.rounds == 1
    assert hogged.reasons == [
        "other processes use 2.9 of 2 cores",
        "identical forwards vary by 10%",
    ]
    assert probed(monkeypatch, [QUIET]).rounds == 1


def test_a_quiet_record_with_one_noisy_short_probe_is_not_busy(monkeypatch, threads_restored):
    torch.set_num_threads(2)
    quiet = [probed(monkeypatch, [QUIET]) for _ in range(3)]
    record = noise.NoiseRecord(
        before=[quiet[0]], during=[quiet[1], probed(monkeypatch, [NOISY, QUIET]), quiet[2]]
    )
    written = record.as_dict()
    assert not record.busy and written["busy"] is False
    assert written["reasons"] == [] and written["busy_readings"] == []
    assert not any(sample["busy"] for sample in written["before"] + written["during"])


def test_a_record_is_busy_as_its_readings_say_and_names_them():
    quiet, hogged = reading(30.0, 2, busy=False), reading(90.0, 2)
    settled = noise.NoiseRecord(before=[hogged, quiet], during=[quiet, quiet])
    assert not settled.busy  # the machine settled before timing began
    record = noise.NoiseRecord(before=[hogged, quiet], during=[quiet, hogged, quiet])
    written = record.as_dict()
    assert record.busy and written["busy_readings"] == ["during[1]"]
    assert written["reasons"] == hogged.reasons
    for place in written["busy_readings"]:
        side, index = place.rstrip("]").split("[")
        assert written[side][int(index)]["busy"]


def spin() -> None:  # pragma: no cover - runs in the hog processes
    while True:
        pass


def test_cpu_hogs_beside_the_run_make_it_busy(monkeypatch, threads_restored):
    hogs = [multiprocessing.Process(target=spin, daemon=True) for _ in range(2)]
    for hog in hogs:
        hog.start()
    try:
        others = noise.other_load()
    finally:
        for hog in hogs:
            hog.terminate()
    assert others > noise.BUSY_OTHER_CORES
    torch.set_num_threads(2)
    reading = probed(monkeypatch, [QUIET], others=others)
    assert reading.busy and reading.reasons[0].startswith("other processes use")
