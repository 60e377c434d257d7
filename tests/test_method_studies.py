"""A measured study is not started when its time cannot finish one trial."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

from autotune.measure.costs import LatencyCurve
from autotune.methods import studies


@dataclass
class Trial:
    prompts: list
    max_new_tokens: int

    def __call__(self, config: dict) -> dict:
        raise AssertionError("a trial ran")


def context(forward_s: float):
    notes: list[str] = []
    ws = SimpleNamespace(
        verify_curve=lambda n: LatencyCurve([forward_s] * n),
        target=SimpleNamespace(name="m", fingerprint="f"),
        storage="sqlite://",
        hardware={"threads": 1},
    )
    return SimpleNamespace(workspace=ws, note=notes.append, workers=None), notes


def test_a_trial_is_costed_from_the_tokens_both_decoders_decode():
    ctx, _ = context(0.07)
    # 6 prompts x 64 tokens, for the method and for plain greedy, at 70 ms a forward
    assert studies.first_trial_seconds(ctx, Trial([0] * 6, 64)) == 2 * 6 * 64 * 0.07
    assert studies.first_trial_seconds(ctx, lambda config: {}) == 0.0  # not a timed trial


def test_a_study_whose_budget_cannot_finish_a_trial_is_not_started(monkeypatch):
    opened = []
    monkeypatch.setattr("autotune.studies.tune.open_study", opened.append)
    ctx, notes = context(0.07)
    studies.run_method_study(
        ctx,  # type: ignore[arg-type]
        "medusa/x",
        {},
        Trial([0] * 6, 64),
        trials=4,
        label="medusa tree study (measured)",
        objective_text="measured speedup",
        budget=60.0,  # above the least a study needs, under one trial's ~54 s plus that
    )
    assert len(opened) == 1 and notes and "first trial needs about 74 s" in notes[0]


@dataclass
class Progressive(Trial):
    grace: int = 3

    @property
    def fidelities(self) -> int:
        return len(self.prompts)

    def steps(self, config: dict):
        raise AssertionError("a trial ran")


def test_a_progressive_trial_is_costed_to_its_first_rung():
    ctx, _ = context(0.07)
    # 12 prompts, pruned at the earliest after 3: the method and plain greedy on those
    objective = Progressive([0] * 12, 64)
    assert isinstance(objective, studies.Progressive)
    assert studies.first_trial_seconds(ctx, objective) == 2 * 3 * 64 * 0.07
