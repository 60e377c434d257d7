"""The run's time plan (`--budget`), and where heads come from when none are given."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.budget import Budget
from autotune.errors import AutotuneError
from autotune.schedule import Phase, Schedule, parse_duration
from autotune.training.job import cached_heads_folder
from autotune.training.sources import UPSTREAM, find_heads


@pytest.mark.parametrize(
    ("text", "seconds"), [("20m", 1200), ("1h", 3600), ("90s", 90), ("45", 45), ("1.5m", 90)]
)
def test_budget_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["soon", "m", "-5m", "0"])
def test_a_budget_that_is_no_duration_is_one_line(text):
    with pytest.raises(AutotuneError, match="--budget"):
        parse_duration(text)


class FrozenBudget(Budget):
    """A budget whose clock the test sets."""

    def __init__(self, seconds, elapsed):
        super().__init__(seconds)
        self.now = elapsed

    def elapsed(self):
        return self.now


def test_a_late_phase_gets_its_share_of_what_is_left():
    budget = FrozenBudget(100, 0)
    schedule = Schedule(budget, [Phase("a", 50), Phase("b", 30), Phase("c", 20)])
    assert schedule.begin("a").seconds == pytest.approx(50)
    budget.now = 80  # a overran by 30: b and c share the 20 s left, as planned (3:2)
    assert schedule.begin("b").seconds == pytest.approx(12)
    budget.now = 92
    assert schedule.begin("c").seconds == pytest.approx(8)
    assert len(schedule.lines()) == 4 and "~1:40" in schedule.lines()[0]


def test_the_searches_give_up_their_time_before_the_final_measurement():
    budget = FrozenBudget(100, 0)
    phases = [Phase("a", 40), Phase("b", 20), Phase("c", 20), Phase("held-back", 20, reserved=True)]
    schedule = Schedule(budget, phases)
    schedule.begin("a")
    budget.now = 70  # a overran by 30: b and c share what the reserved 20 s leave
    assert schedule.begin("b").seconds == pytest.approx(5)
    budget.now = 75
    assert schedule.begin("c").seconds == pytest.approx(5)
    budget.now = 90  # c overran too: the reserved phase gets what is left
    assert schedule.begin("held-back").seconds == pytest.approx(10)
    budget.now = 101
    assert Schedule(budget, [Phase("d", 10), Phase("e", 5, reserved=True)]).begin("d").seconds == 0


def test_without_a_budget_every_phase_gets_its_plan():
    schedule = Schedule(Budget(None), [Phase("a", 50), Phase("b", 30)])
    assert schedule.begin("b").seconds == 30


def test_scripts_tune_each_method_for_the_seconds_they_give():
    from types import SimpleNamespace

    from autotune.profiling.tune import tuning_schedule

    plan = SimpleNamespace(methods=[SimpleNamespace(name="glide"), SimpleNamespace(name="eagle")])
    schedule = tuning_schedule(plan, 240.0)  # type: ignore[arg-type]
    assert schedule.begin("tune eagle").seconds == 240
    assert schedule.begin("fit CAPE").seconds == 240
    assert schedule.begin("tune glide").seconds == 240


# --- heads found without being given --------------------------------------------------


def accept(folder: Path) -> None:
    if not (folder / "config.json").is_file():
        raise AutotuneError(f"{folder}: no config.json")


def heads_folder(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"medusa_num_heads": 2}))
    return folder


def fake_hub_snapshot(hub: Path, repo: str) -> Path:
    repo_dir = hub / f"models--{repo.replace('/', '--')}"
    (repo_dir / "refs").mkdir(parents=True)
    (repo_dir / "refs" / "main").write_text("abc123")
    return heads_folder(repo_dir / "snapshots" / "abc123")


def test_heads_in_autotunes_cache_come_first(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOTUNE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    own = heads_folder(cached_heads_folder("f" * 16, "medusa"))
    fake_hub_snapshot(tmp_path / "hub", UPSTREAM["vicuna-7b"]["medusa"])
    found = find_heads("medusa", "vicuna-7b", "f" * 16, accept)
    assert found is not None and found.folder == own and "heads cache" in found.source


def test_published_heads_are_read_from_the_hugging_face_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOTUNE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    snapshot = fake_hub_snapshot(tmp_path / "hub", UPSTREAM["vicuna-7b"]["eagle"])
    found = find_heads("eagle", "vicuna-7b", "f" * 16, accept)
    assert found is not None and found.folder == snapshot
    assert UPSTREAM["vicuna-7b"]["eagle"] in found.source
    # another model's, or another kind's, are not taken
    assert find_heads("medusa", "vicuna-7b", "f" * 16, accept) is None
    assert find_heads("eagle", "vicuna-13b", "f" * 16, accept) is None


def test_a_damaged_cached_folder_is_passed_over(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOTUNE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    cached_heads_folder("f" * 16, "medusa").mkdir(parents=True)  # no config.json
    assert find_heads("medusa", "smollm2-135m", "f" * 16, accept) is None


def test_a_budget_counts_from_the_process_start_and_keeps_its_reserve_back():
    """--budget is the command's deadline: its imports and checks count, and the ending
    (writing, reporting, exiting) is kept back from what the phases may spend."""
    import time

    from autotune.budget import process_started

    started = process_started()
    assert started < time.monotonic() - 0.5  # this test process has run a while already
    budget = Budget(100.0, started=time.monotonic() - 30.0, reserve=10.0)
    assert budget.left() == pytest.approx(60.0, abs=1.0)
    assert Budget(5.0, reserve=10.0).spent()
    assert Budget(None, reserve=10.0).left() is None


def test_a_command_called_within_a_longer_process_counts_from_the_call(monkeypatch):
    import sys
    import time

    from autotune.budget import command_started, process_started

    monkeypatch.setattr(sys, "argv", ["/usr/lib/python3/site-packages/pytest", "-q"])
    assert command_started() == pytest.approx(time.monotonic(), abs=0.5)
    monkeypatch.setattr(sys, "argv", ["/work/venv/bin/autotune", "profile"])
    assert command_started() == pytest.approx(process_started(), abs=0.5)


def test_a_phase_outside_the_plan_records_the_time_the_plan_left_it(monkeypatch):
    """After the verdict, the engines' own settings take what the plan leaves; the
    ledger says so, where it said "planned 0:00" and an overrun."""
    from types import SimpleNamespace

    from autotune import plan
    from autotune.measure.noise import NoiseRecord, Reading
    from autotune.profiling import state

    monkeypatch.setattr(state, "probe", lambda runner, forwards: Reading(10.0, 0.01, 0.0, 2, 2))
    facts = plan.Facts(
        forward_s=0.01, verify_relative=(1.0,), methods=("ngram",), budget_s=600.0, load_levels=1
    )
    done = {"probe ngram", "tune ngram", "selection (search prompts)", "held-back measurement"}
    run = state.RunState(
        setup=None,  # type: ignore[arg-type]  (no phase here reads it)
        ws=SimpleNamespace(runner=None),  # type: ignore[arg-type]
        tuning=None,  # type: ignore[arg-type]
        budget=FrozenBudget(600.0, 0.0),
        facts=facts,
        evidence=plan.Evidence(done=done),
        noise=NoiseRecord(),
        heads={},
    )

    def work(run, budget):
        return run, None, "bought"

    load = state.planned(run, "under load (held back)")
    assert 0 < load < 600
    left_to_it, _ = state.phase(lambda run: "engine settings", leftover=True)(work)(run)
    assert left_to_it.ledger[-1]["planned_s"] == pytest.approx(600 - load, abs=0.1)
    unplanned, _ = state.phase(lambda run: "engine settings")(work)(run)
    assert unplanned.ledger[-1]["planned_s"] == 0.0
