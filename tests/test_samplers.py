"""The alternative sampler and the Draft & Verify reference search."""

from __future__ import annotations

import optuna
import pytest

from autotune.engine.runner import Runner
from autotune.tuners.dv_baseline import dv_search
from autotune.tuners.skopt_sampler import SkoptSampler

pytestmark = pytest.mark.usefixtures("one_thread")


def test_skopt_sampler_finds_the_optimum_of_a_quadratic():
    study = optuna.create_study(
        direction="maximize", sampler=SkoptSampler(n_initial_points=5, seed=0)
    )
    study.optimize(
        lambda t: (
            -((t.suggest_float("x", -4, 4) - 1.5) ** 2) - (t.suggest_int("n", 0, 10) - 7) ** 2
        ),
        n_trials=25,
    )
    assert abs(study.best_params["x"] - 1.5) < 0.5
    assert study.best_params["n"] == 7


def test_dv_search_returns_a_real_draft(tiny_llama):
    runner = Runner(tiny_llama)
    prompts = [[1, 5, 9, 3], [2, 7, 7, 4, 1], [6, 6, 2]]
    seen = []
    best, values = dv_search(runner, prompts, trials=4, on_trial=seen.append)
    assert len(values) == 4 and seen == values
    assert best.size > 0  # a verdict of no speculation is not a mask
    assert max(values) > 0


def test_skopt_sampler_proposes_a_new_point_each_trial():
    """The optimiser is rebuilt at every ask: with one fixed random state it proposed the
    same initial point again and again."""
    import optuna

    from autotune.tuners.skopt_sampler import SkoptSampler

    study = optuna.create_study(sampler=SkoptSampler(n_initial_points=5, seed=0))
    study.optimize(
        lambda t: t.suggest_float("x", -1, 1) ** 2 + t.suggest_int("k", 0, 50), n_trials=6
    )
    points = [(round(t.params["x"], 9), t.params["k"]) for t in study.trials]
    assert len(set(points)) == len(points), points
    again = optuna.create_study(sampler=SkoptSampler(n_initial_points=5, seed=0))
    again.optimize(
        lambda t: t.suggest_float("x", -1, 1) ** 2 + t.suggest_int("k", 0, 50), n_trials=6
    )
    assert [(round(t.params["x"], 9), t.params["k"]) for t in again.trials] == points
