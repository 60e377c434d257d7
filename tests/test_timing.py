"""Side-by-side measurement: interleaving, per-category drafters, batches, the figures."""

from __future__ import annotations

import pytest

from autotune.drafters.self_spec import DraftExitPolicy, LayerSkipDrafter
from autotune.engine.runner import Runner
from autotune.engine.skip import SkipMask
from autotune.measure import timing
from autotune.measure.timing import EncodedPrompt, SideBySide, Variant, measure_variants

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = [EncodedPrompt(f"p{i}", [1, 5 + i, 9, 33], category="ab"[i % 2]) for i in range(8)]


def drafter():
    return LayerSkipDrafter(SkipMask.of(mlp=[3]), DraftExitPolicy(3, 0.0, None))


def test_order_alternates_prompt_by_prompt(tiny_llama, monkeypatch):
    order = []
    plain, speculative = timing.decode_plain, timing.decode_speculative
    monkeypatch.setattr(timing, "decode_plain", lambda *a: order.append("plain") or plain(*a))
    monkeypatch.setattr(
        timing, "decode_speculative", lambda *a: order.append("method") or speculative(*a)
    )
    session = SideBySide(Runner(tiny_llama), {"m": drafter}, 6)
    session.measure(PROMPTS[:2])
    session.measure(PROMPTS[2:4])  # a second batch goes on rotating
    timed = order[2:]  # after the warm-up's two decodes
    assert timed == ["plain", "method", "method", "plain"] * 2
    assert len(session.measurements["m"].prompts) == 4


def test_each_category_gets_its_own_drafter(tiny_llama):
    made = []

    def maker(label):
        def make():
            made.append(label)
            return drafter()

        return make

    variant = Variant(maker("default"), by_category={"b": maker("for b")})
    measured = measure_variants(Runner(tiny_llama), {"m": variant}, PROMPTS, 6)["m"]
    assert sorted(made) == ["default", "for b"]  # built once each, reused across prompts
    assert measured.lossless is True and len(measured.prompts) == len(PROMPTS)


def test_summary_carries_the_interval_and_the_categories(tiny_llama):
    measured = measure_variants(Runner(tiny_llama), {"m": drafter}, PROMPTS, 8)["m"]
    row = measured.summary()
    low, high = row["speedup_interval"]
    assert low <= row["speedup"] <= high
    assert row["interval_confidence"] == 0.95 and row["looks"] == 1
    assert row["tokens"] == 8 * len(PROMPTS) and row["prompts"] == 8
    assert set(row["by_category"]) == {"a", "b"}
    for name, part in row["by_category"].items():
        assert part["prompts"] == 4 and "by_category" not in part, name
    # one category only: no breakdown
    single = measure_variants(
        Runner(tiny_llama),
        {"m": drafter},
        [EncodedPrompt(p.id, p.ids, "a") for p in PROMPTS[:3]],
        4,
    )["m"]
    assert "by_category" not in single.summary()


def test_more_looks_widen_the_interval(tiny_llama):
    measured = measure_variants(Runner(tiny_llama), {"m": drafter}, PROMPTS, 8)["m"]
    one = measured.interval()
    measured.looks = 6
    six = measured.interval()
    assert six.low <= one.low and six.high >= one.high


def test_an_implausible_latency_curve_is_named():
    from autotune.measure.costs import LatencyCurve, implausible

    assert implausible(LatencyCurve([0.031, 0.033, 0.036, 0.041])) is None
    # what a busy machine once gave: 4 tokens at 0.29x of one
    problem = implausible(LatencyCurve([0.959, 0.5, 0.4, 0.278]))
    assert problem == "verifying 2 tokens took 0.52x the time of verifying 1"
    assert implausible(LatencyCurve([0.031, 0.035, 0.012])).startswith("verifying 3 tokens")
    # a tiny model's sub-millisecond forwards are not judged
    assert implausible(LatencyCurve([0.0008, 0.0003])) is None


def test_a_curve_that_stays_implausible_is_refused(tiny_llama, monkeypatch):
    from autotune.errors import AutotuneError
    from autotune.measure import costs

    monkeypatch.setattr(
        costs, "measure_latency_curve", lambda *a, **k: costs.LatencyCurve([0.9, 0.2, 0.2])
    )
    said = []
    with pytest.raises(AutotuneError, match="too busy to time"):
        costs.measure_verify_curve(Runner(tiny_llama), 3, 1, say=said.append)
    assert len(said) == costs.CURVE_TRIES - 1 and "measuring it again" in said[0]
    calls = iter([costs.LatencyCurve([0.9, 0.2]), costs.LatencyCurve([0.030, 0.032])])
    monkeypatch.setattr(costs, "measure_latency_curve", lambda *a, **k: next(calls))
    assert costs.measure_verify_curve(Runner(tiny_llama), 2, 1).seconds == [0.030, 0.032]


def test_a_sparse_curve_times_the_grid_and_interpolates_between(tiny_llama):
    from autotune.measure import costs

    assert costs.grid_sizes(7) == [1, 2, 3, 4, 5, 6, 7]
    assert costs.grid_sizes(50) == [1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 40, 48, 50]
    assert costs.interpolated({1: 1.0, 4: 4.0, 8: 6.0}, 8) == [1, 2, 3, 4, 4.5, 5, 5.5, 6]
    curve = costs.measure_verify_curve(Runner(tiny_llama), 20, 1, sparse=True)
    assert len(curve.seconds) == 20 and all(s > 0 for s in curve.seconds)
    # 9 lies between the timed 8 and 10
    low, high = sorted((curve(8), curve(10)))
    assert low <= curve(9) <= high


def test_one_verify_curve_serves_every_length_in_a_run(tiny_target, tmp_path, monkeypatch):
    """Methods ask for curves of different lengths: one sparse curve is timed, once."""
    from autotune import hardware, workspace
    from autotune.measure import costs

    timed = []
    real = costs.measure_verify_curve

    def counting(runner, max_tokens, *args, **kwargs):
        timed.append((max_tokens, kwargs.get("sparse")))
        return real(runner, max_tokens, *args, **kwargs)

    monkeypatch.setattr(costs, "measure_verify_curve", counting)
    ws = workspace.Workspace(
        ref=None,
        target=tiny_target,
        runner=Runner(tiny_target.model),
        prompts_path=tmp_path,
        prompts=[],
        storage="",
        hardware=hardware.describe(),
    )
    short, long = ws.verify_curve(17), ws.verify_curve(64)
    assert timed == [(workspace.SHARED_CURVE_TOKENS, True)]
    assert len(short.seconds) == 17 and long.seconds[:17] == short.seconds


def test_a_measurement_with_a_time_limit_stops_after_its_least(tiny_target):
    """Past its time, a side-by-side measurement starts no more prompts, yet still pairs
    ``MIN_PROMPTS`` of them (a tuner's confirmation never overruns by a whole list)."""
    from autotune.budget import Budget
    from autotune.drafters.ngram import LookupConfig, NgramDrafter
    from autotune.engine.runner import Runner
    from autotune.measure.timing import MIN_PROMPTS, EncodedPrompt, measure_variants

    runner = Runner(tiny_target.model)
    prompts = [
        EncodedPrompt(str(i), tiny_target.encode_chat(f"Count to {i}."), None) for i in range(5)
    ]
    config = LookupConfig(1, 2, 4, 1, 1, 4, "first")
    spent = Budget(0.0)
    measured = measure_variants(
        runner, {"ngram": lambda: NgramDrafter(config)}, prompts, 6, until=spent
    )
    assert len(measured["ngram"].prompts) == MIN_PROMPTS
    unlimited = measure_variants(runner, {"ngram": lambda: NgramDrafter(config)}, prompts, 6)
    assert len(unlimited["ngram"].prompts) == len(prompts)


def test_a_held_back_first_look_short_of_time_takes_the_least_an_interval_needs(tiny_llama):
    from autotune.budget import Budget
    from autotune.measure.sequential import FIRST_LOOK, measure_until_decided
    from autotune.measure.stats import MIN_PROMPTS

    prompts = [EncodedPrompt(f"q{i}", [1, 7 + i, 9, 33]) for i in range(FIRST_LOOK + 4)]
    session = SideBySide(Runner(tiny_llama), {"m": drafter}, 4)
    result = measure_until_decided(session, prompts, "m", 1.0, budget=Budget(0.0))
    assert len(session.measurements["m"].prompts) == MIN_PROMPTS < FIRST_LOOK
    assert result.looks == 1 and result.stopped in {"time", "decided"}
    # with time, the first look is whole
    session = SideBySide(Runner(tiny_llama), {"m": drafter}, 4)
    measure_until_decided(session, prompts, None, 1.0, budget=Budget(600.0))
    assert len(session.measurements["m"].prompts) == FIRST_LOOK


def test_past_the_runs_deadline_the_held_back_measurement_stops_after_one_prompt(tiny_llama):
    from autotune.budget import Budget
    from autotune.measure.sequential import measure_until_decided

    prompts = [EncodedPrompt(f"q{i}", [1, 7 + i, 9, 33]) for i in range(12)]
    session = SideBySide(Runner(tiny_llama), {"m": drafter}, 4)
    result = measure_until_decided(
        session, prompts, "m", 1.0, budget=Budget(600.0), deadline=Budget(0.0)
    )
    assert len(session.measurements["m"].prompts) == 1
    assert result.stopped == "time"  # one prompt decides nothing, however it came out


@pytest.fixture
def slow_clock(monkeypatch) -> list[float]:
    """A fake clock on which every decoding takes 10 s (read and moved through the list)."""
    from autotune.measure import timing

    clock = [0.0]
    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr("autotune.budget.time.monotonic", lambda: clock[0])

    def slow(decode, *args):
        result = decode(*args)
        clock[0] += 10.0
        return result, 10.0

    monkeypatch.setattr(timing, "_timed", slow)
    return clock


SIX_PROMPTS = [EncodedPrompt(f"q{i}", [1, 7 + i, 9, 33]) for i in range(6)]


def test_no_prompt_starts_that_the_deadline_leaves_no_time_to_finish(tiny_llama, slow_clock):
    """The run's deadline stops the held-back measurement before a prompt that would end
    past it (going by the slowest so far), not only once it has passed: a prompt started
    with a second left ran 18 s past a busy run's --budget."""
    from autotune.budget import Budget

    prompts, clock = SIX_PROMPTS, slow_clock
    session = SideBySide(Runner(tiny_llama), {"m": drafter}, 4)
    # a prompt (greedy and m) takes 20 s: 45 s leave time for two, not for a third
    measured = session.measure(prompts, until=None, least=0, deadline=Budget(45.0))
    assert measured == 2 and clock[0] == 40.0
    # the first prompt of all starts whatever is left: there is nothing to go by
    fresh = SideBySide(Runner(tiny_llama), {"m": drafter}, 4)
    assert fresh.measure(prompts, until=None, least=0, deadline=Budget(1.0)) == 1


def test_a_phase_past_its_share_does_its_least_only_until_the_run_s_deadline(
    tiny_llama, slow_clock
):
    """A tuning phase's share spent, its measurement still takes its least prompts, but
    none that the run's deadline (the budget the share lies within) leaves no time to
    finish: a profile whose engine ran slow took 9:24 of a 3:20 share and ended 4:16 past
    its --budget."""
    from autotune.budget import Budget

    prompts = SIX_PROMPTS  # the fake clock (``slow_clock``): 20 s a prompt, m and greedy
    run = Budget(65.0)
    share = run.part(0.1)  # 6.5 s: spent after the first prompt
    session = SideBySide(Runner(tiny_llama), {"m": drafter}, 4)
    assert session.measure(prompts, until=share, least=6) == 3  # not 6: 60 s of 65
    alone = SideBySide(Runner(tiny_llama), {"m": drafter}, 4)
    assert alone.measure(prompts, until=Budget(6.5), least=6) == 6  # no deadline: its least
