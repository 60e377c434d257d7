"""The verdict (``profiling.decide``): the fastest finalist whose simultaneous interval
clears the bar, never `none` while one does."""

from __future__ import annotations

import random

from autotune.measure.timing import Measurement, PromptMeasurement
from autotune.profile.blocks import Figures
from autotune.profiling.heldback import HeldBack
from autotune.profiling.select import finalists
from autotune.profiling.verdict import decide


class Settings:
    """What ``decide`` reads of a method's settings: its selection figures."""

    def __init__(self, speedup: float, low: float, high: float):
        self.selection = Figures(
            speedup=speedup,
            speedup_interval=[low, high],
            tokens_per_step=1.0,
            acceptance_rate=0.5,
            tokens_per_s=1.0,
            baseline_tokens_per_s=1.0,
            lossless=True,
            prompts=8,
        )


def measured(speedup: float, prompts: int = 8, spread: float = 0.05, seed: int = 0) -> Measurement:
    rng = random.Random(seed)
    rows = []
    for i in range(prompts):
        greedy = 4.0 * (1 + 0.2 * rng.random())
        rows.append(
            PromptMeasurement(
                f"p{i}",
                128,
                greedy,
                128,
                greedy / (speedup * (1 + spread * rng.uniform(-1, 1))),
                64,
                100,
                60,
                True,
            )
        )
    return Measurement(rows)


def test_the_issue_case_recommends_the_method_that_clears_the_bar():
    # ranked first on search prompts, slower than greedy held back (the issue's Medusa);
    # ranked second, clearly faster held back (its n-gram)
    tuned = {"medusa": Settings(1.116, 0.906, 1.422), "ngram": Settings(1.10, 1.0, 1.3)}
    held = HeldBack({"medusa": measured(0.85), "ngram": measured(1.33, seed=1)}, 1, "prompts")
    verdict = decide(tuned, ["medusa", "ngram"], held, 0.0)  # type: ignore[arg-type]
    assert verdict.recommended == "ngram"
    assert "simultaneous over 2 finalists" in verdict.reason


def test_none_when_no_finalist_clears_the_bar():
    tuned = {"medusa": Settings(1.05, 0.95, 1.2)}
    held = HeldBack({"medusa": measured(0.98, spread=0.3)}, 1, "prompts")
    verdict = decide(tuned, ["medusa"], held, 0.0)  # type: ignore[arg-type]
    assert verdict.recommended == "none" and "no interval lies above 1.00" in verdict.reason


def test_a_method_slower_on_search_prompts_is_no_finalist():
    tuned = {"a": Settings(0.9, 0.8, 0.99), "b": Settings(1.2, 1.1, 1.3)}
    assert finalists(tuned, ["b", "a"], 1.0) == ["b"]  # type: ignore[arg-type]
    held = HeldBack({"a": measured(1.5), "b": measured(1.1, seed=2)}, 1, "prompts")
    # "a" was never a finalist: its held-back figures choose nothing
    assert decide(tuned, ["b", "a"], held, 0.0).recommended == "b"  # type: ignore[arg-type]


def test_a_lone_method_left_no_time_for_search_figures_is_judged_held_back():
    class Unmeasured:
        selection = None

    tuned = {"ngram": Unmeasured()}
    assert finalists(tuned, ["ngram"], 1.0) == ["ngram"]  # type: ignore[arg-type]
    held = HeldBack({"ngram": measured(1.3)}, 1, "prompts")
    assert decide(tuned, ["ngram"], held, 0.0).recommended == "ngram"  # type: ignore[arg-type]
    slow = HeldBack({"ngram": measured(0.97)}, 1, "prompts")
    assert decide(tuned, ["ngram"], slow, 0.0).recommended == "none"  # type: ignore[arg-type]
    # among several, one without search figures is not a finalist
    both = {"ngram": Unmeasured(), "eagle": Settings(1.2, 1.05, 1.4)}
    assert finalists(both, ["eagle", "ngram"], 1.0) == ["eagle"]  # type: ignore[arg-type]
    # a race that had no time: every method is undecided, judged held back
    none = {"ngram": Unmeasured(), "eagle": Unmeasured()}
    assert finalists(none, ["ngram", "eagle"], 1.0) == ["ngram", "eagle"]  # type: ignore[arg-type]


def test_too_few_held_back_prompts_at_the_deadline_recommend_nothing():
    tuned = {"ngram": Settings(1.3, 1.1, 1.5)}
    cut = HeldBack({"ngram": measured(1.6, prompts=3)}, 1, "decided", planned=8)
    verdict = decide(tuned, ["ngram"], cut, 0.0)  # type: ignore[arg-type]
    assert verdict.recommended == "none"
    assert "the budget ran out after 3 of 8 held-back prompts" in verdict.reason
    asked = HeldBack({"ngram": measured(1.6, prompts=3)}, 1, "prompts", planned=3)
    assert decide(tuned, ["ngram"], asked, 0.0).recommended == "ngram"  # type: ignore[arg-type]


def test_engine_settings_are_measured_beside_the_leader_and_reported_per_engine():
    """The leader's engine settings ride along held back (distinct ones once), are not
    judged, and land in the profile's ``engines`` with their figures."""
    from pathlib import Path

    from autotune.drafters.engine_lookup import EngineLookupConfig
    from autotune.methods.base import DraftEnv
    from autotune.methods.ngram.settings import NgramSettings, block_of
    from autotune.profile.blocks import EngineVariant
    from autotune.profiling.heldback import engine_variants
    from autotune.profiling.report import engine_lines, with_engine_figures

    def own(config: EngineLookupConfig) -> EngineVariant:
        return EngineVariant(setting=block_of(config).model_dump(), description=config.engine)

    shared = own(EngineLookupConfig("vllm", 1, 3, 4))
    settings = NgramSettings(
        draft=block_of(EngineLookupConfig("hf", 1, 2, 10)),
        engines={
            "vllm": shared,
            "hf": shared,  # the same setting for two engines: decoded once
            "llamacpp": own(EngineLookupConfig("llamacpp", 2, 2, 5)),
        },
    )
    env = DraftEnv(ref=None, runner=None, base_dir=Path("."))  # type: ignore[arg-type]
    variants = engine_variants("ngram", settings, env)
    assert set(variants) == {"ngram@vllm,hf", "ngram@llamacpp"}
    assert variants["ngram@llamacpp"].make().policy == EngineLookupConfig("llamacpp", 2, 2, 5)
    held = HeldBack({"ngram": measured(1.2), "ngram@llamacpp": measured(0.9, seed=3)}, 1, "prompts")
    verdict = decide({"ngram": settings}, ["ngram"], held, 0.0)  # type: ignore[dict-item]
    assert verdict.recommended == "ngram"  # judged on its own figures alone
    filled = with_engine_figures({"ngram": settings}, held.measured)["ngram"]
    assert filled.engines["llamacpp"].measured is not None
    assert abs(filled.engines["llamacpp"].measured.speedup - 0.9) < 0.05
    assert filled.engines["vllm"].measured is None  # no time for it: not invented
    lines = engine_lines("ngram", filled)
    # each figure says where it was measured: in autotune's engine, by the engine's rule
    (llamacpp,) = [line for line in lines if line.startswith("ngram for llama.cpp: llamacpp: 0.89")]
    assert llamacpp.endswith("in autotune's engine, by llama.cpp's rule")
    assert "ngram for vLLM: vllm: unmeasured" in lines
    assert not any(" in llamacpp" in line for line in lines)
    # not measured in llama-server: said to be an estimate, with how to measure it there
    assert any("autotune's engine's estimate" in line for line in lines)


def test_engine_restricts_the_methods_to_those_it_serves():
    from autotune.methods import registry
    from autotune.profiling.setup import servable

    methods = list(registry.methods().values())
    kept, unserved = servable(methods, ("llamacpp",), asked=False)
    assert {m.name for m in kept} == {"ngram", "self_spec"}
    assert "medusa" in unserved and "llama.cpp" in unserved["medusa"]
    kept, _ = servable(methods, ("llamacpp", "vllm"), asked=False)
    assert {"ngram", "self_spec", "medusa", "eagle"} <= {m.name for m in kept}
