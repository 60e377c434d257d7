"""Exports measured where they serve (``autotune verify``): the side by side itself with
stand-in engines; llama.cpp's llama-server (where ``autotune engines build llamacpp`` has
built it, as CI does) accepting the exported flags and drafting with them; transformers'
generate with the exported keys; and the command's one-line errors."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from autotune.errors import AutotuneError
from autotune.export import export_profile
from autotune.measure.timing import EncodedPrompt
from autotune.serving import Decoded, llamacpp
from autotune.verify import DEFAULT, EXPORT, GREEDY, side_by_side

needs_llamacpp = pytest.mark.skipif(
    not llamacpp.built(), reason="llama-server is not built: autotune engines build llamacpp"
)


def test_the_side_by_side_rotates_pairs_and_checks_every_output():
    calls = []

    def engine(name: str, seconds: float, tokens: list[int]):
        def decode(ids, max_new_tokens):
            calls.append(name)
            return Decoded(tokens=tokens[:max_new_tokens], seconds=seconds, drafted=4, accepted=3)

        return decode

    variants = {
        GREEDY: engine(GREEDY, 2.0, [5, 6, 7, 8]),
        DEFAULT: engine(DEFAULT, 1.0, [5, 6, 7, 8]),
        EXPORT: engine(EXPORT, 0.5, [5, 6, 9, 8]),  # not the greedy output
    }
    prompts = [EncodedPrompt(f"p{i}", [1, 2, 3]) for i in range(3)]
    measured = side_by_side(variants, prompts, 4)
    # a warm-up of each, then each prompt in an order that rotates
    assert calls[3:] == [GREEDY, DEFAULT, EXPORT, DEFAULT, EXPORT, GREEDY, EXPORT, GREEDY, DEFAULT]
    assert set(measured) == {DEFAULT, EXPORT}
    assert measured[DEFAULT].speedup == pytest.approx(2.0)
    assert measured[EXPORT].speedup == pytest.approx(4.0)
    assert measured[DEFAULT].lossless is True and measured[EXPORT].lossless is False
    assert len(measured[EXPORT].prompts) == 3


@pytest.mark.embedded
@needs_llamacpp
def test_llama_server_takes_the_ngram_export_and_drafts(embedded_target, embedded_gguf):
    from test_ngram_export import TREE, ngram_profile

    flags = llamacpp.flags_of(export_profile(ngram_profile(TREE), "llamacpp").text)
    text = "Repeat this list three times: red, green, blue, yellow, red, green, blue, yellow."
    ids = embedded_target.encode_chat(text)
    with llamacpp.Server(embedded_gguf, []) as plain, llamacpp.Server(embedded_gguf, flags) as spec:
        greedy = plain.decode(ids, 48)
        drafted = spec.decode(ids, 48)
    assert greedy.drafted == 0 and greedy.tokens
    assert drafted.drafted > 0 and 0 <= drafted.accepted <= drafted.drafted
    assert drafted.tokens == greedy.tokens  # greedy speculation is lossless there too


@pytest.mark.embedded
@needs_llamacpp
def test_llama_server_takes_the_self_spec_export_with_a_draft_model(embedded_target, embedded_gguf):
    from test_export import fixture

    flags = llamacpp.flags_of(export_profile(fixture("self_spec"), "llamacpp").text)
    ids = embedded_target.encode_chat("Name three fruits.")
    # the draft: here the model itself, which the export's note leaves to the user
    with llamacpp.Server(embedded_gguf, [*flags, "--spec-draft-model", str(embedded_gguf)]) as s:
        assert s.decode(ids, 16).drafted > 0


@pytest.mark.embedded
@needs_llamacpp
def test_a_flag_the_release_removed_is_one_line_refusal(embedded_gguf):
    with pytest.raises(AutotuneError, match="refused --draft-max 4") as error:
        llamacpp.Server(embedded_gguf, ["--draft-max", "4"]).__enter__()
    assert "\n" not in str(error.value)


@pytest.mark.embedded
def test_verify_in_transformers_records_the_figures(tmp_path, embedded_target):
    from test_ngram_export import TREE, ngram_profile

    from autotune.profile.io import read_profile, write_profile
    from autotune.verify import verify

    path = tmp_path / "profile.yaml"
    profile = ngram_profile(TREE)
    profile.workload.prompts = "mt_bench.jsonl"
    write_profile(profile, path)
    report = verify(path, "hf", limit=2, max_new_tokens=12)
    assert set(report.variants) == {DEFAULT, EXPORT}
    assert all(m.lossless for m in report.variants.values())
    verified = read_profile(path).methods.ngram.verified
    assert [v.engine for v in verified] == ["hf"]
    assert verified[0].release.startswith("transformers ") and verified[0].prompts == 2


def test_an_export_that_drafts_with_a_draft_model_says_it_needs_one():
    assert llamacpp.needs_draft_model(["--spec-type", "draft-simple", "--spec-draft-n-max", "4"])
    assert not llamacpp.needs_draft_model(["--spec-type", "draft-simple", "-md", "d.gguf"])
    assert not llamacpp.needs_draft_model(["--spec-type", "ngram-simple"])


@pytest.mark.embedded
@needs_llamacpp
def test_verify_of_self_spec_in_llamacpp_asks_for_the_draft_model(tmp_path):
    from autotune.verify import verify

    path = tmp_path / "profile.yaml"
    path.write_text(
        (Path(__file__).parent / "data" / "profile_smollm2-135m_self_spec.yaml").read_text()
    )
    with pytest.raises(AutotuneError, match="pass --draft-gguf"):
        verify(path, "llamacpp", limit=1, max_new_tokens=4)


def test_verify_refuses_engines_it_cannot_run(tmp_path):
    from autotune.verify import verify

    with pytest.raises(AutotuneError, match="not runnable here"):
        verify(tmp_path / "p.yaml", "vllm")


def test_building_without_cmake_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("AUTOTUNE_CACHE", str(tmp_path))
    monkeypatch.setattr(shutil, "which", lambda tool: None)
    with pytest.raises(AutotuneError, match="needs cmake and c\\+\\+"):
        llamacpp.build()
    assert not any(tmp_path.iterdir())  # nothing half-built


@pytest.fixture
def embedded_gguf() -> Path:
    from autotune.models import resolve_model

    try:
        return resolve_model("smollm2-135m").path
    except AutotuneError:
        pytest.skip("the embedded model is not installed")


@pytest.mark.embedded
@needs_llamacpp
def test_verify_tunes_ngram_simple_in_llama_server_and_records_it(
    tmp_path, embedded_target, monkeypatch
):
    """--tune: an Optuna study in the study database over ngram-simple's options, each
    setting in its own llama-server beside the greedy one; the fastest becomes the
    profile's llama.cpp setting, with its figures there, and is what gets verified."""
    import optuna
    from test_ngram_export import TREE, ngram_profile

    from autotune.profile.io import read_profile, write_profile
    from autotune.serving import tuning
    from autotune.verify import report_lines, verify

    monkeypatch.setattr(tuning, "GRID", ["1,3", "2,3"])
    monkeypatch.setattr(tuning, "PROMPTS", 3)
    path = tmp_path / "profile.yaml"
    profile = ngram_profile(TREE)
    profile.workload.prompts = "mt_bench.jsonl"
    write_profile(profile, path)
    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    report = verify(path, "llamacpp", limit=2, max_new_tokens=12, tune_s=120, storage=storage)
    tuned = report.tuned
    assert tuned is not None and tuned.size_n in (1, 2) and tuned.size_m == 3
    assert len(tuned.measurement.prompts) == 3 and tuned.measurement.lossless
    own = read_profile(path).methods.ngram.engines["llamacpp"]
    assert own.tuned_in == tuned.release and own.served is not None
    assert own.setting["max_match"] == tuned.size_n and own.setting["draft_tokens"] == 3
    # the study is in the database, every grid point tried
    (summary,) = optuna.get_all_study_summaries(storage)
    assert summary.study_name.startswith("llamacpp-ngram/") and summary.n_trials == 2
    # the verified export is the setting tuned there
    exported = export_profile(read_profile(path), "llamacpp", force=True).text
    assert f"--spec-ngram-simple-size-n {tuned.size_n} --spec-ngram-simple-size-m 3" in exported
    assert "tuned and measured in llama.cpp" in exported
    assert report_lines(report)[0].startswith(f"tuned in {tuned.release}: 2 ngram-simple")


def test_tune_is_for_ngram_in_llamacpp(tmp_path):
    from test_export import fixture

    from autotune.profile.io import write_profile
    from autotune.verify import verify

    path = tmp_path / "profile.yaml"
    profile = fixture("self_spec")
    profile.workload.prompts = "mt_bench.jsonl"
    write_profile(profile, path)
    with pytest.raises(AutotuneError, match="--tune tunes n-gram drafting"):
        verify(path, "hf", limit=1, max_new_tokens=4, tune_s=10)


def test_the_llamacpp_grid_holds_only_settings_that_draft():
    from autotune.serving.tuning import GRID, sizes

    pairs = [sizes(s) for s in GRID]
    assert all(m >= n for n, m in pairs)  # ngram-simple drafts only where n tokens follow
    assert (3, 2) not in pairs and (1, 2) in pairs and (4, 12) in pairs


def test_concurrent_rounds_keep_that_many_requests_in_flight():
    """The client side of a load level: every prompt decoded once, never more requests at
    once than the level, outputs in the prompts' order."""
    import threading
    import time

    from autotune.serving.load import concurrent_rounds

    busy, most = [0], [0]
    lock = threading.Lock()

    def decode(ids, max_new_tokens):
        with lock:
            busy[0] += 1
            most[0] = max(most[0], busy[0])
        time.sleep(0.01)
        with lock:
            busy[0] -= 1
        return Decoded(tokens=[len(ids)] * max_new_tokens, seconds=0.01)

    run = concurrent_rounds({"off": decode}, 3)
    batch = [[1] * n for n in range(1, 8)]
    result = run("off", batch, 3)
    assert most[0] == 3 and result.concurrency == 3
    assert [r.tokens for r in result.results] == [[n] * 3 for n in range(1, 8)]
    assert result.tokens == 21 and all(t >= 0.01 for t in result.latencies)
    # the server's own decoding times (0.01 s each, 3 side by side) make the decoding time
    assert result.decode_seconds == pytest.approx(7 * 0.01 / 3)


@pytest.mark.embedded
@needs_llamacpp
def test_verify_under_load_serves_the_export_with_slots_and_records_it(tmp_path, embedded_target):
    """--concurrency: one llama-server with as many slots as the highest level, with and
    without the export's speculation, rounds of concurrent requests at each level."""
    from test_ngram_export import CHAIN, ngram_profile

    from autotune.profile.io import read_profile, write_profile
    from autotune.verify import load_report_lines, verify_load

    path = tmp_path / "profile.yaml"
    profile = ngram_profile(CHAIN)
    profile.workload.prompts = "mt_bench.jsonl"
    write_profile(profile, path)
    load = verify_load(path, (1, 2), rounds=2, limit=4, max_new_tokens=8)
    assert load.parallel == 2 and [lv.concurrency for lv in load.levels] == [1, 2]
    for level in load.levels:
        assert level.rounds == 2 and level.tokens_per_s > 0 and level.baseline_tokens_per_s > 0
        low, high = level.speedup_interval
        assert low <= level.speedup <= high
    assert "--spec-type ngram-simple" in load.setting
    recorded = read_profile(path).methods.ngram.load
    assert recorded is not None and recorded.engines["llamacpp"] == load
    lines = load_report_lines("ngram", load)
    assert "2 slots" in lines[0] and len(lines) == 4


def test_verify_under_load_is_for_llamacpp(tmp_path, run_autotune):
    from test_ngram_export import CHAIN, ngram_profile

    from autotune.profile.io import write_profile

    path = tmp_path / "profile.yaml"
    write_profile(ngram_profile(CHAIN), path)
    done = run_autotune(["verify", path, "--engine", "hf", "--concurrency", "1,2"], cwd=tmp_path)
    assert done.returncode == 2 and "--engine llamacpp" in done.stderr
    assert "Traceback" not in done.stderr
