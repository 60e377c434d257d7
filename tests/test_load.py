"""Speculation under load (``measure.load``, ``tuners.load_schedule``): levels measured
with several requests in flight, the setting chosen per level, the crossover."""

from __future__ import annotations

import pytest

from autotune.errors import AutotuneError
from autotune.measure.load import (
    OFF,
    TUNED,
    LevelFigure,
    LevelResult,
    best_fixed,
    crossover,
    in_engine,
    load_candidates,
    measure_level,
    parse_levels,
    schedule_of,
)
from autotune.measure.stats import Interval
from autotune.methods import registry
from autotune.methods.base import DraftEnv
from autotune.methods.ngram.settings import NgramLookup, NgramSettings
from autotune.models.ref import TargetRef
from autotune.tuners.load_schedule import fit_schedule

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = [[1, 5, 9, 33, 5, 9, 33, 70], [1, 100, 3, 3, 3, 100, 3], [1, 40, 41, 40, 41, 42]]
SETTING = NgramSettings(
    draft=NgramLookup(
        min_match=1,
        max_match=3,
        draft_tokens=6,
        candidates=2,
        branch_tokens=2,
        max_tree_tokens=8,
        prefer="recent",
    )
)


def figure(speedup: float, low: float, high: float, lossless: bool = True) -> LevelFigure:
    return LevelFigure(speedup, Interval(low, high, 0.95, 6), 10.0, 10.0, 1.0, 1.0, lossless)


def level(concurrency: int, **figures: LevelFigure) -> LevelResult:
    return LevelResult(concurrency, 6, dict(figures))


def test_each_level_takes_the_fastest_setting_clearly_above_one_else_off():
    levels = [
        level(1, tuned=figure(1.4, 1.2, 1.6), small=figure(1.2, 1.1, 1.3)),
        level(2, tuned=figure(1.05, 0.95, 1.15), small=figure(1.1, 1.02, 1.2)),
        level(4, tuned=figure(0.9, 0.8, 1.0), small=figure(1.2, 1.1, 1.3, lossless=False)),
        level(8, tuned=figure(0.8, 0.7, 0.9), small=figure(0.95, 0.9, 1.0)),
    ]
    schedule = schedule_of(levels)
    assert schedule == {1: "tuned", 2: "small", 4: OFF, 8: OFF}
    assert crossover(schedule) == 4
    assert crossover({1: "tuned", 2: OFF, 4: "small"}) is None  # it pays again at the top
    assert best_fixed(levels) == "small"  # mean 1.1125 against 1.0375


@pytest.mark.parametrize("text", ["", "0,2", "a,b", "1,300", "-1"])
def test_bad_concurrency_levels_say_what_to_give(text):
    with pytest.raises(AutotuneError, match="--concurrency"):
        parse_levels(text)


def test_levels_are_parsed_sorted_and_none_turns_them_off():
    assert parse_levels("8,1, 2,4,2") == (1, 2, 4, 8)
    assert parse_levels("none") == ()


def test_candidates_halve_the_draft_down_to_one_token():
    candidates = load_candidates(registry.method("ngram"), SETTING)
    assert list(candidates) == [TUNED, "<= 4 tokens", "<= 2 tokens", "<= 1 tokens"]
    assert candidates[TUNED].cap is None and candidates["<= 2 tokens"].cap == 2
    small = candidates["<= 2 tokens"].settings.draft
    assert small.max_tree_tokens == 2 and small.draft_tokens == 2 and small.branch_tokens == 2


@pytest.fixture
def env(tiny_llama_dir):
    ref = TargetRef.for_user(str(tiny_llama_dir))
    runner = ref.runner()
    runner.eos_token_ids = frozenset()
    return DraftEnv(ref, runner)


def test_a_level_measures_every_candidate_against_plain_on_the_same_rounds(env):
    method = registry.method("ngram")
    makers = {
        name: method.variant(c.settings, env).make
        for name, c in load_candidates(method, SETTING).items()
    }
    seen = []
    run_round = in_engine(env.runner, 12, makers)
    result = measure_level(run_round, list(makers), PROMPTS, 2, 3, on_round=seen.append)
    assert seen == [1, 2, 3] and result.rounds == 3 and result.concurrency == 2
    assert set(result.figures) == set(makers)
    for name, f in result.figures.items():
        assert f.lossless, name
        assert f.interval.low <= f.speedup <= f.interval.high
        assert f.tokens_per_s > 0 and f.plain_tokens_per_s > 0 and f.latency_s > 0


def test_a_schedule_holds_whole_levels_and_skips_what_the_time_left_cannot_fit(env):
    method = registry.method("ngram")
    load = fit_schedule(
        env.runner,
        method,
        SETTING,
        env,
        PROMPTS,
        PROMPTS[::-1],
        8,
        [1, 2, 4],
        3,
        seconds_left=lambda: 0.0,
        first_level_s=1.0,
    )
    assert load.levels == [] and load.skipped == [1, 2, 4]
    load = fit_schedule(env.runner, method, SETTING, env, PROMPTS, PROMPTS[::-1], 8, [2, 1], 3)
    assert [lv.concurrency for lv in load.levels] == [1, 2] and not load.skipped
    for lv in load.levels:
        assert lv.lossless and lv.rounds == 3 and lv.tuned_speedup is not None
        if lv.setting == OFF:
            assert lv.speedup == 1.0 and lv.max_draft_tokens == 0
        else:
            assert lv.speedup_interval[0] > 1.0  # chosen on search, but measured held back
    assert load.crossover in (None, 1, 2)
