"""Shared greedy timings and studies whose trials report as they go (ASHA prunes them)."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import optuna
import pytest
from optuna.distributions import IntDistribution
from optuna.trial import TrialState

from autotune.drafters.ngram import LookupConfig, NgramDrafter
from autotune.engine.decoding import DecodeResult
from autotune.engine.runner import Runner
from autotune.measure import shared_greedy
from autotune.measure.shared_greedy import LossyDecoding, SharedGreedy
from autotune.measure.timing import EncodedPrompt, Measurement

PROMPT = EncodedPrompt("p0", [1, 5, 9, 33, 5, 9], category="a")


def drafter() -> NgramDrafter:
    return NgramDrafter(LookupConfig(1, 2, 4, 1, 1, 4, "first"))


def logged(monkeypatch) -> list[str]:
    """The decodings the shared timings run, in order."""
    order: list[str] = []
    plain, speculative = shared_greedy.decode_plain, shared_greedy.decode_speculative
    monkeypatch.setattr(
        shared_greedy, "decode_plain", lambda *a: order.append("plain") or plain(*a)
    )
    monkeypatch.setattr(
        shared_greedy,
        "decode_speculative",
        lambda *a: order.append("method") or speculative(*a),
    )
    return order


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_greedy_is_timed_once_then_again_once_its_timing_is_old(
    tiny_llama, monkeypatch, one_thread
):
    runner = Runner(tiny_llama)
    order = logged(monkeypatch)
    clock = Clock()
    greedy = SharedGreedy(max_new_tokens=6, retime_after_s=100.0, retime_per_trial=9, clock=clock)
    rows = []
    for now in (0, 50, 99, 100, 150, 210):  # a trial's row at each time
        clock.now = now
        rows.append(greedy.method_row(runner, PROMPT, drafter()))
    # timed at 0 (plain first), lent at 50 and 99, timed again at 100 (the method first),
    # lent at 150, timed again at 210 (plain first)
    assert order == (
        ["plain", "method", "method", "method"] + ["method", "plain", "method", "plain", "method"]
    ), order
    assert greedy.timings(PROMPT) == 3
    assert rows[0].baseline_seconds == rows[2].baseline_seconds != rows[3].baseline_seconds
    assert all(r.lossless and r.baseline_tokens == 6 == r.method_tokens for r in rows)
    assert Measurement(rows).summary()["prompts"] == 6  # the timing module's figures


def test_a_trial_re_times_at_most_its_share_of_prompts(tiny_llama, monkeypatch, one_thread):
    runner = Runner(tiny_llama)
    prompts = [EncodedPrompt(f"p{i}", [1, 5 + i, 9, 33, 5 + i, 9]) for i in range(3)]
    clock = Clock()
    greedy = SharedGreedy(max_new_tokens=6, retime_after_s=10.0, retime_per_trial=2, clock=clock)
    for prompt in prompts:  # the first trial times greedy on every prompt
        greedy.method_row(runner, prompt, drafter())
    clock.now = 20.0  # every timing is old
    greedy.warm_up(runner, drafter(), prompts[0])  # the second trial
    for prompt in prompts:
        greedy.method_row(runner, prompt, drafter())
    assert [greedy.timings(p) for p in prompts] == [2, 2, 1]  # the third waits
    greedy.warm_up(runner, drafter(), prompts[0])
    greedy.method_row(runner, prompts[2], drafter())
    assert greedy.timings(prompts[2]) == 2


def test_a_lossy_method_fails_with_the_token_where_it_differs(tiny_llama, monkeypatch, one_thread):
    runner = Runner(tiny_llama)
    greedy = SharedGreedy(max_new_tokens=6)
    greedy.method_row(runner, PROMPT, drafter())  # greedy tokens kept

    def wrong(runner, drafter, ids, max_new_tokens):
        right = shared_greedy.decode_plain(runner, ids, max_new_tokens).tokens
        return DecodeResult(right[:2] + [right[2] + 1] + right[3:], steps=3)

    monkeypatch.setattr(shared_greedy, "decode_speculative", wrong)
    with pytest.raises(LossyDecoding, match=r"prompt p0: .* differs .*\(token 2 is"):
        greedy.method_row(runner, PROMPT, drafter())


def test_the_timings_are_the_process_s(tiny_llama):
    first = shared_greedy.for_process("tiny-test-key", 6)
    assert shared_greedy.for_process("tiny-test-key", 6) is first
    assert shared_greedy.for_process("tiny-test-key", 7) is not first


# --- a progressive objective under ASHA (Ray) ---------------------------------------------


@dataclass
class Climb:
    """Reports x, x, ... after each of ``fidelities`` steps: a trial of a lower x falls
    behind at every rung."""

    fidelities: int = 9
    grace: int = 1

    def steps(self, config: dict):
        import time

        for step in range(self.fidelities):
            time.sleep(0.05)
            yield {"objective": float(config["x"]), "step": step}

    def __call__(self, config: dict) -> dict:
        *_, final = self.steps(config)
        return final


@pytest.fixture(scope="module")
def ray_session():
    import ray
    from ray import cloudpickle

    from autotune.studies.tune import init_ray

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    init_ray()
    yield
    ray.shutdown()
    cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


@pytest.mark.ray
def test_asha_prunes_trials_and_the_budget_counts_whole_ones(tmp_path, ray_session):
    from autotune.methods.studies import Progressive, asha
    from autotune.studies import trials as held
    from autotune.studies.tune import StudySpec, budgeted, run_study

    objective = Climb()
    assert isinstance(objective, Progressive)
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    spec = StudySpec(
        name="tiny/climb",
        storage_url=url,
        space={"x": IntDistribution(0, 6)},
        metric="objective",
        trials=3,
        max_trials=12,
        sampler=optuna.samplers.RandomSampler(seed=0),
        # the best first: the next, far behind, is pruned at the first rung
        seeds=[{"x": 6}, {"x": 0}],
        timed=True,  # one trial at a time: the order above holds
        user_attrs={"method": "test"},
    )
    run_study(spec, objective, label="climb", scheduler=asha(objective))
    trials = optuna.load_study(study_name="tiny/climb", storage=url).get_trials()
    states = [t.state for t in trials]
    assert set(states) <= {TrialState.COMPLETE, TrialState.PRUNED}
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    pruned = [t for t in trials if t.state == TrialState.PRUNED]
    assert trials[0].state == TrialState.COMPLETE and trials[0].value == 6.0
    assert trials[1].state == TrialState.PRUNED and trials[1].params == {"x": 0}
    # Optuna knows how far a pruned trial got; a whole trial reported every step
    assert all(max(t.intermediate_values) < objective.fidelities for t in pruned)
    assert all(len(t.intermediate_values) == objective.fidelities for t in complete)
    # whole trials reach the budget, unless pruned ones reached the cap first
    assert len(complete) == budgeted(trials) and len(trials) <= spec.cap
    assert budgeted(trials) == 3 or held.counted(trials) == spec.cap


@dataclass
class Screened(Climb):
    """Climb, whose first result is a cheap score: a trial of x below 3 stops there."""

    def steps(self, config: dict):
        from autotune.studies.tune import STOPPED

        if config["x"] < 3:
            yield {"objective": float(config["x"]), STOPPED: "screened"}
            return
        yield from super().steps(config)


@pytest.mark.ray
def test_a_trial_that_stops_itself_early_is_pruned(tmp_path, ray_session):
    from autotune.methods.studies import asha
    from autotune.studies.tune import StudySpec, run_study

    objective = Screened(fidelities=3, grace=3)
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    spec = StudySpec(
        name="tiny/screened",
        storage_url=url,
        space={"x": IntDistribution(0, 6)},
        metric="objective",
        trials=2,
        max_trials=4,
        sampler=optuna.samplers.RandomSampler(seed=0),
        seeds=[{"x": 1}, {"x": 5}, {"x": 2}, {"x": 6}],
        timed=True,
        user_attrs={"method": "test"},
    )
    run_study(spec, objective, label="screened", scheduler=asha(objective))
    trials = optuna.load_study(study_name="tiny/screened", storage=url).get_trials()
    by_x = {t.params["x"]: t for t in trials}
    for x in (1, 2):  # stopped after their first result: pruned, with that result
        assert by_x[x].state == TrialState.PRUNED
        assert by_x[x].intermediate_values == {1: float(x)}
        assert by_x[x].user_attrs["stopped"] == "screened"
    assert by_x[5].state == by_x[6].state == TrialState.COMPLETE
    assert len(by_x[6].intermediate_values) == 3


def test_the_ngram_proxy_prunes_a_setting_before_it_decodes():
    from autotune.drafters.ngram import LookupConfig
    from autotune.measure.costs import LatencyCurve
    from autotune.methods import registry
    from autotune.methods.ngram.replay import Continuation, Costs, Replayer
    from autotune.methods.ngram.trials import NgramObjective, params_from_config

    class NoDecoding:
        def runner(self):
            raise AssertionError("a screened trial must not decode")

    text = (1, 5, 9, 33, 5, 9, 33, 5, 9, 33)
    proxy = Replayer(
        [Continuation(text, text[3:], 7)], lambda c: Costs(LatencyCurve([1.0] * 16), 0.0)
    )
    config = LookupConfig(1, 2, 4, 1, 1, 4, "first")
    predicted = proxy.speedup(config, proxy.indices())
    assert predicted > 1.0  # the continuation repeats: drafting pays on the proxy
    objective = NgramObjective(
        NoDecoding(), [PROMPT], 6, grace=2, proxy=proxy, proxy_floor=predicted * 1.01
    )
    assert objective.fidelities == 2  # the proxy's result, then the one prompt
    results = list(objective.steps(params_from_config(config, registry.method("ngram").space())))
    assert len(results) == 1
    assert results[0]["objective"] == results[0]["proxy"] == predicted
    assert "stopped" in results[0]
