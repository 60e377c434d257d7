"""The run's plan (``autotune.plan``), from numbers alone: no model is loaded."""

from __future__ import annotations

import dataclasses

import pytest

from autotune import plan
from autotune.plan import Bound, Evidence, Facts, Lead

# verifying n tokens over one, as measured on 2 cores (the 4 -> 8 step included)
CPU_CURVE = (1.0, 1.13, 1.26, 1.39, 1.7, 2.0, 2.5, 3.16, 3.17, 3.18, 3.19, 3.2, 3.21, 3.21)


def facts(**overrides) -> Facts:
    values = {
        "forward_s": 0.03,
        "verify_relative": CPU_CURVE,
        "methods": ("ngram", "self_spec", "medusa", "eagle"),
        "train": {"medusa": "medusa", "eagle": "eagle"},
        "min_training": {"medusa": 45.0, "eagle": 45.0},
        "answer_prompts": 60,
        "extra_answer_prompts": 200,
    }
    return Facts(**{**values, **overrides})


def seconds_of(phases, prefix: str) -> dict[str, float]:
    return {p.name: p.seconds for p in phases if p.name.startswith(prefix)}


def test_a_chain_bound_pays_for_its_verification():
    # every token accepted: the deepest chain, paid at its verification cost
    best, depth = plan.chain_speedup([1.0] * 10, CPU_CURVE)
    assert depth == 10 and best == pytest.approx(11 / CPU_CURVE[10])
    # acceptance that halves with depth: the 4 -> 8 step makes deeper chains dear
    best, depth = plan.chain_speedup([0.5] * 10, CPU_CURVE)
    assert depth == 2 and best == pytest.approx(1.75 / CPU_CURVE[2])
    # nothing accepted: drafting cannot pay
    assert plan.chain_speedup([0.0] * 4, CPU_CURVE) == (1.0, 0)
    # a costly draft lowers the bound
    assert (
        plan.chain_speedup([0.5] * 4, CPU_CURVE, 0.2)[0]
        < plan.chain_speedup([0.5] * 4, CPU_CURVE)[0]
    )


def test_accuracy_grows_optimistically_but_never_past_the_cap():
    assert plan.extrapolated_accuracy(0.2, 30, 30) == pytest.approx(0.2)
    assert plan.extrapolated_accuracy(0.1, 30, 60) == pytest.approx(0.1 * 2**plan.LEARNING_EXPONENT)
    assert plan.extrapolated_accuracy(0.1, 1, 1000) == pytest.approx(0.1 * plan.MAX_GROWTH)
    assert plan.extrapolated_accuracy(0.5, 1, 1000) == plan.ACCURACY_CAP


def test_a_wide_tree_pays_for_every_token_it_verifies():
    flat = (1.0, 1.0, 1.0, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7)
    # five wide: depth 1 verifies 6 tokens (1.2 x one), depth 2 eleven (1.7 x one)
    tree, depth = plan.chain_speedup([0.9, 0.5], flat, width=5)
    assert depth == 1 and tree == pytest.approx(1.9 / 1.2)
    # on this CPU's curve six tokens cost 2.0 x one: no five-wide tree pays
    assert plan.chain_speedup([0.9], CPU_CURVE, width=5) == (1.0, 0)


def test_a_method_whose_bound_cannot_beat_the_leader_is_skipped_with_the_numbers():
    lead = Lead("ngram", 1.45, 1.3, 1.6, 6)
    weak = plan.heads_bound("medusa", [0.05, 0.02, 0.01], [0.12, 0.05, 0.02], CPU_CURVE, 30, 150)
    why = plan.skip_reason(weak, lead)
    assert why is not None and "ngram" in why and f"{weak.speedup:.3f}x" in why
    assert "1.300" in why  # the leader's lower bound it could not reach
    strong = plan.heads_bound("medusa", [0.6, 0.5, 0.4], [0.8, 0.7, 0.6], CPU_CURVE, 30, 150)
    assert plan.skip_reason(strong, lead) is None
    # no leader yet: only a bound under greedy itself skips
    assert plan.skip_reason(weak, None) is None or weak.speedup <= 1.0
    assert plan.skip_reason(Bound("x", 0.9, "a proxy"), None) is not None


def test_drafting_cost_lowers_a_head_bound_and_is_said():
    # the probe's heads of the run (top-1 0.14 grown to 0.23), against a leader
    # whose low end is 1.03: drafting free they may win; charged the shared lm_head's
    # 0.2 of a forward a depth, as measured on 2 cores, they cannot even beat greedy
    top1, top5 = [0.14, 0.03, 0.04], [0.33, 0.14, 0.11]
    free = plan.heads_bound("medusa", top1, top5, CPU_CURVE, 60, 126)
    charged = plan.heads_bound("medusa", top1, top5, CPU_CURVE, 60, 126, draft_relative=0.2)
    assert charged.speedup < free.speedup and charged.speedup <= 1.0
    assert "drafted free" in free.evidence and "drafted at 0.20 of a forward" in charged.evidence
    lead = Lead("ngram", 1.118, 1.029, 1.3, 4)
    assert plan.skip_reason(free, lead) is None and plan.skip_reason(charged, lead) is not None


def test_the_skipped_methods_time_goes_to_the_leaders_study():
    f = facts()
    evidence = Evidence(done={"answers", "probe ngram"}, lead=Lead("ngram", 1.45, 1.3, 1.6, 6))
    before = plan.phases(f, evidence, 900.0)
    assert "tune ngram" in seconds_of(before, "tune")
    # the leader's study comes before any training, and with more time than the others'
    names = [p.name for p in before]
    assert names.index("tune ngram") < names.index("train medusa heads")
    tuning = seconds_of(before, "tune")
    assert tuning["tune ngram"] > 2 * max(v for k, v in tuning.items() if k != "tune ngram")
    assert {"probe self_spec", "probe medusa", "probe eagle"} <= {p.name for p in before}
    # every other method probed, and bound under the leader's low end: all skipped
    for name, speedup in (("self_spec", 0.9), ("medusa", 1.1), ("eagle", 1.2)):
        bound = Bound(name, speedup, "probe")
        evidence.bounds[name] = bound
        evidence.done.add(f"probe {name}")
        why = plan.skip_reason(bound, evidence.lead)
        assert why is not None
        evidence.skipped[name] = why
    after = plan.phases(f, evidence, 900.0)
    names = [p.name for p in after]
    assert names[0] == "tune ngram" and not any(n.startswith(("train", "probe")) for n in names)
    assert "fit CAPE" not in names and "selection (search prompts)" not in names
    assert seconds_of(after, "tune")["tune ngram"] > 2 * seconds_of(before, "tune")["tune ngram"]
    assert sum(p.seconds for p in after) == pytest.approx(900.0, rel=0.01)


def test_a_leader_that_needs_more_time_for_its_trials_gets_it_within_a_cap():
    evidence = Evidence(done={"answers", "probe ngram"}, lead=Lead("ngram", 1.3, 1.1, 1.5, 10))
    plain = seconds_of(plan.phases(facts(), evidence, 1000.0), "tune")["tune ngram"]
    wanted = plain * 1.3
    asked = seconds_of(
        plan.phases(facts(leader_tuning_s={"ngram": wanted}), evidence, 1000.0), "tune"
    )
    assert asked["tune ngram"] == pytest.approx(wanted)
    # never so much that the others are left nothing
    greedy = facts(leader_tuning_s={"ngram": 1e6})
    phases = plan.phases(greedy, evidence, 1000.0)
    measuring = sum(p.seconds for p in phases if p.reserved)
    leader = seconds_of(phases, "tune")["tune ngram"]
    assert leader == pytest.approx(plan.LEADER_MAX_SHARE * (1000.0 - measuring))
    others = sum(p.seconds for p in phases if not p.reserved) - leader
    assert others >= (1 - plan.LEADER_MAX_SHARE) * (1000.0 - measuring) * 0.99
    # a leader that needs less than its share keeps its share
    modest = facts(leader_tuning_s={"ngram": 1.0})
    assert seconds_of(plan.phases(modest, evidence, 1000.0), "tune")["tune ngram"] == plain


def test_a_phase_plan_fits_the_time_and_keeps_the_measurements_least():
    f = facts()
    phases = plan.phases(f, Evidence(), 1200.0)
    names = [p.name for p in phases]
    assert names[0] == "answers" and names[1] == "probe ngram"
    assert names.index("probe medusa") < names.index("train medusa heads")
    assert names[-1] == "held-back measurement"
    assert sum(p.seconds for p in phases) <= 1200.0 * 1.01
    per_prompt = 128 * 0.03 * (1 + 4 * plan.SPECULATIVE_COST)
    held = next(p for p in phases if p.name == "held-back measurement")
    assert held.seconds == pytest.approx(plan.HELDBACK_PLANNED * per_prompt)
    # a tiny budget still keeps the least prompts an interval needs
    tiny = plan.phases(f, Evidence(), 60.0)
    held = next(p for p in tiny if p.name == "held-back measurement")
    assert held.seconds == pytest.approx(plan.LEAST_INTERVAL_PROMPTS * per_prompt)
    # a slow machine: as many as the measurements' share holds
    slow = plan.phases(facts(forward_s=0.07), Evidence(), 1200.0)
    held = next(p for p in slow if p.name == "held-back measurement")
    assert plan.LEAST_INTERVAL_PROMPTS < held.count < plan.HELDBACK_PLANNED


def test_the_least_budget_grows_with_the_forward_time():
    quick, slow = plan.least_budget(facts()), plan.least_budget(facts(forward_s=0.3))
    assert 60 <= quick < slow and slow > 5 * 60


def test_a_kind_without_the_time_it_needs_is_dropped_first():
    f = facts(
        train={"medusa": "medusa", "glide": "glide"},
        min_training={"medusa": 45.0, "glide": 300.0},
        methods=("ngram", "medusa", "glide"),
    )
    evidence = Evidence()
    planned = plan.training_planned(f, evidence, 1200.0)
    assert set(planned) == {"medusa", "glide"}
    kinds, why = plan.cannot_train(f, planned, evidence)
    assert kinds == {"glide"} and "train glide heads" in why
    evidence.skipped["glide"] = why
    assert plan.cannot_train(f, plan.training_planned(f, evidence, 1200.0), evidence) is None
    big = facts(params=2_000_000_000)
    kinds, why = plan.cannot_train(big, {"medusa": 1e6, "eagle": 1e6}, Evidence())
    assert kinds == {"medusa", "eagle"} and "2.0B" in why


def test_untrainable_drops_kinds_one_at_a_time_and_gives_their_time_to_the_rest():
    f = facts(
        train={"medusa": "medusa", "glide": "glide"},
        min_training={"medusa": 45.0, "glide": 300.0},
        methods=("ngram", "medusa", "glide"),
    )
    dropped = plan.untrainable(f, Evidence(), 1200.0)
    assert list(dropped) == ["glide"] and "train glide heads" in dropped["glide"]
    # too little for either: the one needing the most goes first, then the other
    dropped = plan.untrainable(f, Evidence(), 90.0)
    assert list(dropped) == ["glide", "medusa"]
    assert "train medusa heads" in dropped["medusa"]
    assert plan.untrainable(facts(methods=("ngram",), train={}), Evidence(), 60.0) == {}


def test_a_kinds_least_training_scales_with_how_fast_the_target_runs():
    """The floors were measured on 2 cores; a machine (or model) whose batched forward
    is k times faster needs 1/k the time, down to a probe and a least training after it."""
    from autotune.training.kinds import CALIBRATION_S_PER_TOKEN as ON_2_CORES
    from autotune.training.kinds import KINDS

    least = plan.PROBE_LEAST_S + plan.LEAST_TRAINING_S
    glide, eagle = KINDS["glide"], KINDS["eagle"]
    assert glide.least_training_s(ON_2_CORES) == pytest.approx(glide.min_training_s)
    assert eagle.least_training_s(ON_2_CORES) == pytest.approx(eagle.min_training_s)
    assert glide.least_training_s(2 * ON_2_CORES) == pytest.approx(2 * glide.min_training_s)
    assert glide.least_training_s(ON_2_CORES / 4) == pytest.approx(glide.min_training_s / 4)
    assert glide.least_training_s(ON_2_CORES / 100) == least
    assert eagle.least_training_s(ON_2_CORES / 4) == least
    # the plan keeps GLIDE where the machine trains it fast enough, and drops it on 2 cores
    f = facts(
        train={"eagle": "eagle", "glide": "glide"},
        methods=("ngram", "eagle", "glide"),
    )
    for per_token, kept in ((ON_2_CORES, {"eagle"}), (ON_2_CORES / 50, {"eagle", "glide"})):
        floors = {k: KINDS[k].least_training_s(per_token) for k in ("eagle", "glide")}
        scaled = dataclasses.replace(f, min_training=floors)
        assert {"eagle", "glide"} - set(plan.untrainable(scaled, Evidence(), 600.0)) == kept


def test_of_two_kinds_needing_as_long_the_prior_keeps_eagle_whatever_the_order():
    """Time for one of two kinds of the same least training: EAGLE's is kept, in either
    order of the methods (a set's order decided it, from one process to the next)."""
    for order in (("medusa", "eagle"), ("eagle", "medusa")):
        f = facts(methods=("ngram", *order), train={k: k for k in order})
        assert list(plan.untrainable(f, Evidence(), 400.0)) == ["medusa"]


def test_the_levels_under_load_keep_a_tenth_of_the_budget_after_the_verdict():
    without = plan.phases(facts(budget_s=1200.0), Evidence(), 1200.0)
    assert without[-1].name == "held-back measurement"
    phases = plan.phases(facts(budget_s=1200.0, load_levels=4), Evidence(), 1200.0)
    load = phases[-1]
    assert load.name == "under load (held back)" and load.reserved
    assert load.seconds == pytest.approx(plan.LOAD_SHARE * 1200.0)  # 4 levels want more
    assert sum(p.seconds for p in phases) <= 1200.0 * 1.01
    # the studies give up what the levels keep
    tuned = sum(p.seconds for p in phases if p.name.startswith("tune "))
    assert tuned < sum(p.seconds for p in without if p.name.startswith("tune "))
    # a fast machine needs less than the share for one level
    fast = plan.phases(facts(budget_s=1200.0, load_levels=1, forward_s=0.005), Evidence(), 1200.0)
    assert fast[-1].seconds == pytest.approx(
        plan.load_seconds(facts(forward_s=0.005, load_levels=1))
    )
    assert fast[-1].seconds < plan.LOAD_SHARE * 1200.0


# a graph-captured GPU step (SmolLM2-135M): verifying 64 tokens costs little more than one
GPU_CURVE = tuple(1.0 + 0.004 * n for n in range(64))


def test_on_a_gpu_the_budget_buys_every_method_its_training_and_its_trials():
    """The plan sizes itself from the measured step and curve: on a GPU the same 18
    minutes give every head kind more than its least training and every method a study
    several times the CPU's, where trials are cheap."""
    every = {
        "methods": ("ngram", "self_spec", "medusa", "eagle", "glide"),
        "draft_free": ("ngram",),
        "train": {"medusa": "medusa", "eagle": "eagle", "glide": "glide"},
        "min_training": {"medusa": 45.0, "eagle": 45.0, "glide": 45.0},
        "params": 135_000_000,
        "budget_s": plan.BUDGET_S,
    }
    left = plan.BUDGET_S - 60
    on_gpu = plan.phases(
        facts(forward_s=0.0016, verify_relative=GPU_CURVE, cpu=False, **every), Evidence(), left
    )
    on_cpu = plan.phases(facts(**every), Evidence(), left)
    gpu_training, cpu_training = seconds_of(on_gpu, "train "), seconds_of(on_cpu, "train ")
    gpu_tuning, cpu_tuning = seconds_of(on_gpu, "tune "), seconds_of(on_cpu, "tune ")
    assert set(gpu_training) == {f"train {k} heads" for k in ("medusa", "eagle", "glide")}
    assert all(s >= 2 * 45.0 for s in gpu_training.values())
    assert set(gpu_tuning) == {f"tune {m}" for m in every["methods"]}
    for name, seconds in gpu_tuning.items():
        assert seconds >= plan.LEAST_STUDY_S and seconds >= 2 * cpu_tuning[name]
    # answers decode 20x faster: the time goes to training and tuning, not to waiting
    assert seconds_of(on_gpu, "answers")["answers"] < seconds_of(on_cpu, "answers")["answers"] / 5
    assert sum(gpu_training.values()) > sum(cpu_training.values())


def test_named_methods_are_probed_only_where_the_probe_can_lead():
    """With --methods no bound skips a method: a head kind's slice of training and a
    proxy's bound decide nothing, and a draft-free method's measurement leads only where
    there are others to tune after it."""

    def probes(f: Facts) -> set[str]:
        return {p.name for p in plan.phases(f, Evidence(), 1200.0)} & {
            f"probe {m}" for m in f.methods
        }

    assert probes(facts()) == {"probe ngram", "probe self_spec", "probe medusa", "probe eagle"}
    assert probes(facts(named=True, draft_free=("ngram",))) == {"probe ngram"}
    alone = facts(named=True, methods=("ngram",), draft_free=("ngram",), train={}, min_training={})
    assert probes(alone) == set()
    assert probes(facts(named=True, methods=("medusa",), train={"medusa": "medusa"})) == set()
