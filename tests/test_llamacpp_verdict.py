"""What a profile says of llama.cpp is measured in llama.cpp (issue 44): the llama.cpp
verdict's rules on constructed measurements in llama-server, the wording that says where
each figure was measured, the export that refuses a llama.cpp verdict of none, and the
phase itself run against the real llama-server (where it is built, as CI builds it)."""

from __future__ import annotations

import pytest

from autotune.errors import AutotuneError
from autotune.export import export_profile
from autotune.profile.blocks import EngineFigures, EngineVariant, EngineVerdict, Verdict
from autotune.profiling import in_engine
from autotune.serving import llamacpp

needs_llamacpp = pytest.mark.skipif(
    not llamacpp.built(), reason="llama-server is not built: autotune engines build llamacpp"
)
WHERE = f"llama-server {llamacpp.COMMIT}"
FLAGS = "--spec-type ngram-simple --spec-ngram-simple-size-n 1 --spec-ngram-simple-size-m 6"


def in_server(speedup, low, high, lossless=True, first=None) -> EngineFigures:
    """Figures as llama-server measured them against its own greedy decoding."""
    return EngineFigures(
        speedup=speedup,
        speedup_interval=[low, high],
        tokens_per_step=1.3,
        acceptance_rate=0.4,
        tokens_per_s=100.0 * speedup,
        baseline_tokens_per_s=100.0,
        lossless=lossless,
        prompts=20,
        measured_in=WHERE,
        release=llamacpp.RELEASE,
        flags=FLAGS,
        first_difference=first,
    )


def test_a_setting_that_loses_in_llama_server_is_not_recommended_there():
    verdict = in_engine.engine_verdict({"ngram": in_server(0.669, 0.613, 0.744)}, 0.0)
    assert verdict.recommended == "none"
    assert verdict.measured_in == WHERE
    assert "not clearly faster than llama-server's greedy decoding" in verdict.reason
    assert f"in {WHERE}" in verdict.reason and "0.669x [0.613, 0.744]" in verdict.reason


def test_a_setting_that_is_not_lossless_there_is_not_recommended_and_its_difference_named():
    first = "token 37 of held-back prompt 4 (mt_bench-84)"
    fast_but_wrong = in_server(1.4, 1.2, 1.6, lossless=False, first=first)
    verdict = in_engine.engine_verdict({"ngram": fast_but_wrong}, 0.0)
    assert verdict.recommended == "none"
    assert f"not lossless in {WHERE} on this machine" in verdict.reason
    assert f"first difference at {first}" in verdict.reason


def test_a_setting_that_wins_there_is_recommended_in_the_engines_words():
    verdict = in_engine.engine_verdict({"ngram": in_server(1.3, 1.1, 1.5)}, 0.0)
    assert verdict.recommended == "ngram"
    assert f"in {WHERE}" in verdict.reason and "lossless" in verdict.reason
    # the margin is the profile's: a low end under 1 + margin does not win
    assert in_engine.engine_verdict({"ngram": in_server(1.3, 1.1, 1.5)}, 0.2).recommended == "none"


def test_the_first_difference_counts_new_tokens_from_one():
    assert in_engine.first_difference([1, 2, 3], [1, 2, 3]) is None
    assert in_engine.first_difference([1, 2, 3], [1, 9, 3]) == 2
    assert in_engine.first_difference([1, 2, 3], [1, 2]) == 3  # one stopped early


def llamacpp_profile(figures: EngineFigures | None, verdict: EngineVerdict | None):
    """An n-gram profile whose llama.cpp setting has ``figures`` from llama-server, and
    whose verdict for llama.cpp is ``verdict``."""
    from test_ngram_export import ngram_profile

    from autotune.drafters.engine_lookup import EngineLookupConfig
    from autotune.methods.ngram.settings import block_of, describe

    config = EngineLookupConfig("llamacpp", 1, 1, 6)
    profile = ngram_profile(config)
    block = profile.methods.ngram
    block.engines = {
        "llamacpp": EngineVariant(
            setting=block_of(config).model_dump(),
            description=describe(config),
            measured=block.measured,
            measured_in="autotune's engine, by llama.cpp's rule",
            in_engine=figures,
        )
    }
    engines = {"llamacpp": verdict} if verdict is not None else {}
    profile.verdict = Verdict(
        recommended="ngram",
        reason="measured 1.42x in autotune's engine",
        margin=0.0,
        ranking=["ngram"],
        engines=engines,
    )
    return profile


def test_export_to_llamacpp_refuses_a_llamacpp_verdict_of_none_unless_forced():
    figures = in_server(0.669, 0.613, 0.744)
    none = in_engine.engine_verdict({"ngram": figures}, 0.0)
    profile = llamacpp_profile(figures, none)
    with pytest.raises(AutotuneError, match=r"no method for llama\.cpp") as refused:
        export_profile(profile, "llamacpp")
    assert "\n" not in str(refused.value) and "--force" in str(refused.value)
    assert WHERE in str(refused.value)
    forced = export_profile(profile, "llamacpp", force=True).text
    # the file says where each figure was measured
    assert "measured in autotune's engine, by llama.cpp's rule" in forced
    assert f"measured in {WHERE} ({llamacpp.RELEASE}): 0.669x [0.613, 0.744]" in forced
    # other engines follow the profile's own verdict
    assert export_profile(profile, "vllm").engine == "vllm"


def test_measured_in_llama_server_its_own_verdict_decides_the_export():
    """An autotune-engine estimate that loses does not refuse a setting llama-server
    measured faster and lossless; without that measurement, it does."""
    figures = in_server(1.3, 1.1, 1.5)
    profile = llamacpp_profile(figures, in_engine.engine_verdict({"ngram": figures}, 0.0))
    variant = profile.methods.ngram.engines["llamacpp"]
    losing = variant.measured.model_copy(update={"speedup": 0.9, "speedup_interval": [0.8, 1.0]})
    variant.measured = losing
    assert "--spec-type ngram-simple" in export_profile(profile, "llamacpp").text
    profile.verdict.engines = {}
    with pytest.raises(AutotuneError, match="not clearly faster"):
        export_profile(profile, "llamacpp")


def test_the_profile_lines_name_where_each_llamacpp_figure_was_measured():
    from autotune.profiling.report import engine_lines

    first = "token 37 of held-back prompt 4 (mt_bench-84)"
    figures = in_server(1.4, 1.2, 1.6, lossless=False, first=first)
    judged = figures.model_copy(update={"not_recommended": in_engine.why_not(figures, 1.0)})
    profile = llamacpp_profile(judged, in_engine.engine_verdict({"ngram": figures}, 0.0))
    lines = engine_lines("ngram", profile.methods.ngram)
    assert lines[0].endswith("in autotune's engine, by llama.cpp's rule")
    assert lines[1].startswith(f"ngram in {WHERE}: {FLAGS}: 1.400x [1.200, 1.600]")
    assert f"NOT lossless (first difference at {first})" in lines[1]
    assert "not recommended for llama.cpp: not lossless" in lines[1]
    # not measured there: one line that it is an estimate, and how to measure it
    estimate = engine_lines("ngram", llamacpp_profile(None, None).methods.ngram)
    assert len(estimate) == 2 and "autotune's engine's estimate" in estimate[1]
    assert "autotune engines build llamacpp" in estimate[1] and "--engine llamacpp" in estimate[1]


@pytest.mark.embedded
@needs_llamacpp
def test_the_phase_measures_the_llamacpp_export_in_llama_server(embedded_target, tmp_path):
    """Two held-back prompts of 12 tokens in the real llama-server: the block's llama.cpp
    setting records llama-server as where it was measured, and a verdict is made."""
    from autotune.profile.io import read_profile, write_profile
    from autotune.profiling.request import Measuring, ProfileRequest

    profile = llamacpp_profile(None, None)
    run = run_state(tmp_path, ("llamacpp",))
    measuring = Measuring.of(
        ProfileRequest(model="smollm2-135m", heldback_prompts=2, max_new_tokens=12)
    )
    run, blocks, verdict = in_engine.in_llama_server(
        run, {"ngram": profile.methods.ngram}, measuring
    )
    measured = blocks["ngram"].engines["llamacpp"].in_engine
    assert measured is not None and measured.measured_in == WHERE
    assert measured.prompts == 2 and measured.flags.startswith("--spec-type ngram-simple")
    assert verdict is not None and verdict.measured_in == WHERE
    assert run.ledger[-1]["phase"] == in_engine.PHASE
    # it travels in the profile
    profile.methods.ngram = blocks["ngram"]
    profile.verdict = profile.verdict.model_copy(update={"engines": {"llamacpp": verdict}})
    write_profile(profile, tmp_path / "p.yaml")
    back = read_profile(tmp_path / "p.yaml")
    assert back.methods.ngram.engines["llamacpp"].in_engine.measured_in == WHERE
    assert back.verdict.engines["llamacpp"].recommended in ("ngram", "none")


def run_state(tmp_path, engines):
    """A run's state over the embedded model, as far as a phase after the verdict reads
    it: the workspace, the engines deployed to, the plan's facts, no budget."""
    from autotune import plan
    from autotune.bench import workload_prompts
    from autotune.budget import Budget
    from autotune.measure.noise import NoiseRecord
    from autotune.models.ref import TargetRef
    from autotune.profiling.request import Tuning
    from autotune.profiling.state import RunState
    from autotune.studies.workers import Workers
    from autotune.workspace import Workspace

    ref = TargetRef.for_user("smollm2-135m", None, "float32", "cpu")
    ws = Workspace.open(ref, workload_prompts("mt_bench.jsonl"), storage=None, need_storage=False)
    tuning = Tuning(Workers(), None, None, 12, engines, 0.0, ("ngram",))
    facts = plan.Facts(forward_s=0.01, verify_relative=(1.0,), methods=("ngram",))
    return RunState(
        setup=None,  # type: ignore[arg-type]  (no phase after the verdict reads it)
        ws=ws,
        tuning=tuning,
        budget=Budget(None),
        facts=facts,
        evidence=plan.Evidence(),
        noise=NoiseRecord(),
        heads={},
    )


def test_the_first_plan_said_holds_the_serving_engine_phase(tmp_path, monkeypatch, capsys):
    """`profile --engine llamacpp` with llama-server built says its measurement there in
    the plan it prints at the start, not only in the plans made later."""
    from types import SimpleNamespace

    from autotune import plan
    from autotune.budget import Budget
    from autotune.measure.noise import NoiseRecord
    from autotune.profiling import calibrate
    from autotune.profiling.request import Measuring, ProfileRequest, Tuning
    from autotune.studies.workers import Workers

    facts = plan.Facts(
        forward_s=0.01,
        verify_relative=(1.0,) * 16,
        methods=("ngram",),
        draft_free=("ngram",),
        budget_s=plan.BUDGET_S,
        heldback_prompts=12,
    )
    monkeypatch.setattr(calibrate, "measure_facts", lambda *args: facts)
    monkeypatch.setattr(in_engine.llamacpp, "built", lambda: True)
    setup = SimpleNamespace(skipped={}, heads={})
    ws = SimpleNamespace(runner=None)
    tuning = Tuning(Workers(), None, None, 12, ("llamacpp",), 0.0, ("ngram",))
    measuring = Measuring.of(ProfileRequest(model="smollm2-135m"))
    args = (setup, ws, tuning, measuring, Budget(plan.BUDGET_S), NoiseRecord())
    run = calibrate.start(*args, in_engine.planned)  # type: ignore[arg-type]
    said = " ".join(capsys.readouterr().err.split())
    assert run.facts.engine_decoders == in_engine.DECODERS and in_engine.PHASE in said
    calibrate.start(*args)  # type: ignore[arg-type]
    assert in_engine.PHASE not in " ".join(capsys.readouterr().err.split())
