"""Speculation under load (``measure.load``, ``tuners.load_schedule``): levels measured
with several requests in flight, the setting chosen per level, the crossover."""

from __future__ import annotations

import pytest

from autotune.engine.proposal import Draft, DraftContext, Drafter
from autotune.errors import AutotuneError
from autotune.measure.load import (
    OFF,
    TUNED,
    LevelFigure,
    LevelResult,
    best_fixed,
    crossover,
    in_engine,
    measure_level,
    parse_levels,
    schedule_of,
)
from autotune.measure.stats import Interval
from autotune.measure.ties import lossless_up_to_a_tie
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


class _Never(Drafter):
    """A drafter whose drafts are never accepted: no level can choose it."""

    max_draft_tokens = 4

    def propose(self, context: DraftContext) -> Draft:
        vocab = context.runner.config.vocab_size
        return Draft(tokens=[(context.last_token + 7) % vocab] * 4)


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
    candidates = registry.method("ngram").load_settings(SETTING)
    assert list(candidates) == [TUNED, "<= 4 tokens", "<= 2 tokens", "<= 1 tokens"]
    assert candidates[TUNED][0] is None and candidates["<= 2 tokens"][0] == 2
    small = candidates["<= 2 tokens"][1].draft
    assert small.max_tree_tokens == 2 and small.draft_tokens == 2 and small.branch_tokens == 2


def test_a_smaller_tree_keeps_the_top1_chain_first_and_stays_a_tree():
    from autotune.drafters.eagle import EAGLE1_TREE
    from autotune.engine.tree import check_tree, smaller_tree

    assert smaller_tree(EAGLE1_TREE, 3) == [(0,), (0, 0), (0, 0, 0)]
    assert smaller_tree(EAGLE1_TREE, 6) == [(0,), (1,), (0, 0), (0, 0, 0), (0, 0, 0, 0), (0,) * 5]
    for size in range(1, len(EAGLE1_TREE) + 1):
        kept = smaller_tree(EAGLE1_TREE, size)
        assert len(kept) == size and check_tree(kept) == kept
    assert smaller_tree(EAGLE1_TREE, 99) == check_tree(EAGLE1_TREE)


@pytest.fixture
def env(tiny_llama_dir):
    ref = TargetRef.for_user(str(tiny_llama_dir))
    runner = ref.runner()
    runner.eos_token_ids = frozenset()
    return DraftEnv(ref, runner)


def test_a_level_measures_every_candidate_against_plain_on_the_same_rounds(env):
    method = registry.method("ngram")
    makers = {
        name: method.variant(s, env).make for name, (_, s) in method.load_settings(SETTING).items()
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


def test_a_setting_stays_lossless_where_its_output_parts_only_as_same_allows(env):
    """Outputs that part from plain decoding's are a loss unless ``same`` (a numeric tie,
    in the profile and bench) says otherwise; a changed last token is no tie."""
    method = registry.method("ngram")
    makers = {TUNED: method.variant(SETTING, env).make}
    run_round = in_engine(env.runner, 12, makers)

    def parted(name, batch, concurrency):
        run = run_round(name, batch, concurrency)
        if name != OFF:  # the first request's last token, otherwise
            tokens = run.results[0].tokens
            tokens[-1] = (tokens[-1] + 1) % env.runner.config.vocab_size
        return run

    asked: list = []

    def a_tie(prompt, method_tokens, greedy_tokens) -> bool:
        asked.append(prompt)
        return True

    assert measure_level(parted, [TUNED], PROMPTS, 1, 3, same=a_tie).figures[TUNED].lossless
    assert asked and all(prompt in PROMPTS for prompt in asked)
    assert not measure_level(parted, [TUNED], PROMPTS, 1, 3).figures[TUNED].lossless
    judged = measure_level(parted, [TUNED], PROMPTS, 1, 3, same=lossless_up_to_a_tie(env.runner))
    assert not judged.figures[TUNED].lossless
    assert measure_level(run_round, [TUNED], PROMPTS, 1, 3, same=a_tie).figures[TUNED].lossless


def test_a_schedule_holds_whole_levels_and_skips_what_the_time_left_cannot_fit(env):
    method = registry.method("ngram")
    candidates = method.load_settings(SETTING)
    makers = {name: method.variant(s, env).make for name, (_, s) in candidates.items()}
    caps = {name: cap for name, (cap, _) in candidates.items()}
    args = (env.runner, makers, caps, PROMPTS, PROMPTS[::-1], 8)
    late = fit_schedule(*args, [1, 2, 4], 3, seconds_left=lambda: 0.0)
    assert late.levels == [] and late.skipped == [1, 2, 4]
    fitted = fit_schedule(*args, [2, 1], 3, seconds_left=lambda: 100.0, first_level_s=1.0)
    assert [lv.held.concurrency for lv in fitted.levels] == [1, 2] and not fitted.skipped
    for level in fitted.levels:
        assert level.held.rounds == 3 and TUNED in level.held.figures
        assert all(f.lossless for f in level.held.figures.values())
        assert level.cap == (0 if level.pick == OFF else caps[level.pick])
        assert (level.pick == OFF) == (level.pick not in level.held.figures)
    assert fitted.crossover in (None, 1, 2)
    # where the verdict proved the tuned setting, the level keeps it rather than off
    never = {name: (lambda: _Never()) for name in makers}
    said: list[str] = []
    kept = fit_schedule(
        env.runner, never, caps, PROMPTS, PROMPTS, 8, [1, 2], 3, on_level=said.append, proven={1}
    )
    assert [lv.pick for lv in kept.levels] == [TUNED, OFF]
    # no race where it was proven: only the tuned setting, held back
    assert set(kept.levels[0].held.figures) == {TUNED}
    assert [line for line in said if "choosing among" in line] == [
        f"concurrency 2: choosing among {', '.join(never)}"
    ]


def test_the_profile_measures_the_recommended_method_under_load_and_says_it(
    tmp_path, tiny_llama_dir, monkeypatch
):
    """After the verdict: levels as the time allows, the load block, a line per level,
    a plot panel, and per-batch keys in the vLLM export."""
    import json

    from test_ngram_export import ngram_profile

    from autotune.budget import Budget
    from autotune.export import export_profile
    from autotune.measure.timing import Measurement
    from autotune.profile.report import write_verdict_plot
    from autotune.profiling.heldback import HeldBack
    from autotune.profiling.load import measure_load
    from autotune.profiling.report import load_lines
    from autotune.profiling.request import Measuring, ProfileRequest
    from autotune.workspace import Workspace

    monkeypatch.setenv("AUTOTUNE_CACHE", str(tmp_path / "cache"))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join(json.dumps({"prompt": f"a b c a b c {i}"}) + "\n" for i in range(16))
    )
    ws = Workspace.open(
        TargetRef.for_user(str(tiny_llama_dir)), prompts, f"sqlite:///{tmp_path / 'db.sqlite'}"
    )
    ws.runner.eos_token_ids = frozenset()
    ws.deadline = Budget(600)
    request = Measuring.of(ProfileRequest(model="tiny", max_new_tokens=12, concurrency=(1, 2)))
    held = HeldBack({"ngram": Measurement()}, 1, "")
    tuned = measure_load(ws, {"ngram": SETTING}, "ngram", held, request)
    load = tuned["ngram"].load
    assert [lv.concurrency for lv in load.levels] == [1, 2] and not load.skipped
    assert load.max_new_tokens == 12 and all(lv.lossless for lv in load.levels)
    lines = load_lines("ngram", load)
    assert lines[0].startswith("ngram with 1 request in flight: ") and len(lines) == 3
    # no time left: every level is skipped and said, nothing measured
    ws.deadline = Budget(1)
    late = measure_load(ws, {"ngram": SETTING}, "ngram", held, request)["ngram"].load
    assert late.levels == [] and late.skipped == [1, 2]
    profile = ngram_profile(SETTING.config())
    profile.methods.ngram.load = load
    assert write_verdict_plot(profile, tmp_path / "p.png").stat().st_size > 0
    config = export_profile(profile, "vllm", force=True).text
    assert "num_speculative_tokens_per_batch_size" in config


def test_bench_under_load_prints_each_level_and_its_json(tmp_path, tiny_llama_dir):
    import json

    import yaml
    from test_ngram_export import CHAIN, ngram_profile
    from typer.testing import CliRunner

    from autotune.cli import app
    from autotune.profile.io import write_profile

    path = tmp_path / "profile.yaml"
    write_profile(ngram_profile(CHAIN), path)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"a b a b {i}"}) + "\n" for i in range(6)))
    args = ["bench", str(path), "--model-path", str(tiny_llama_dir), "--prompts", str(prompts)]
    args += ["--concurrency", "2,1", "--rounds", "2", "--max-new-tokens", "8"]
    done = CliRunner().invoke(app, [*args, "-f", "yaml"])
    assert done.exit_code == 0, done.output
    result = yaml.safe_load(done.stdout[done.stdout.index("method:") :])
    assert [row["concurrency"] for row in result["levels"]] == [1, 2]
    for row in result["levels"]:
        assert row["scheduled"] == "tuned" and row["rounds"] == 2  # no load block: tuned
        assert row["tuned"]["lossless"] is True and row["tuned"]["tokens_per_s"] > 0
    table = CliRunner().invoke(app, args)
    assert "ngram in autotune's engine with 2 requests in flight, 2 rounds: tuned " in table.stdout
    bad = CliRunner().invoke(app, [*args[:2], "--concurrency", "none"])
    assert bad.exit_code == 2 and "give the levels" in bad.output
    # an engine's own setting (vLLM's 7-token chain by its rule), capped as its export caps
    from test_ngram_export import SHRINKING, with_engine_variants, with_load

    write_profile(with_load(with_engine_variants(ngram_profile(CHAIN)), SHRINKING), path)
    args[-5] = "4,2"
    engine = CliRunner().invoke(app, [*args, "--engine", "vllm", "-f", "yaml"])
    assert engine.exit_code == 0, engine.output
    result = yaml.safe_load(engine.stdout[engine.stdout.index("method:") :])
    assert result["engine"] == "vllm"
    assert [row["scheduled"] for row in result["levels"]] == ["<= 4 tokens", "off"]
    assert all(row["tuned"]["lossless"] for row in result["levels"])
    assert "<= 4 tokens" in result["levels"][0]
    for wrong, words in [
        (["--engine", "dv"], "dv cannot serve"),
        (["--engine", "tgi"], "unknown engine 'tgi'"),
    ]:
        refused = CliRunner().invoke(app, [*args, *wrong])
        assert refused.exit_code == 2 and words in refused.output, refused.output
    alone = CliRunner().invoke(app, [*args[:2], "--engine", "vllm"])
    assert alone.exit_code == 2 and "--engine goes with --concurrency" in alone.output


def test_the_closing_line_claims_only_what_the_held_back_rounds_prove():
    from autotune.profile.blocks import Load, LoadLevel
    from autotune.profiling.report import load_lines

    def level(concurrency, low, setting="tuned"):
        return LoadLevel(
            concurrency=concurrency,
            setting=setting,
            speedup=1.2,
            speedup_interval=[low, 1.4],
            tokens_per_s=12.0,
            baseline_tokens_per_s=10.0,
            rounds=4,
        )

    proven = Load(levels=[level(1, 1.05), level(2, 1.01)], max_new_tokens=64)
    pays = "ngram: speculation pays at every concurrency measured"
    assert load_lines("ngram", proven)[-1] == pays
    unproven = Load(levels=[level(1, 0.94), level(2, 1.02), level(4, 0.99)], max_new_tokens=64)
    last = load_lines("ngram", unproven)[-1]
    assert "pays" not in last and "interval includes 1.0 at 1, 4 in flight" in last
    # a level served without speculation needs no proof; a crossover is said as before
    off = Load(levels=[level(1, 1.1), level(2, 0.9, "off")], max_new_tokens=64, crossover=2)
    assert load_lines("ngram", off)[-1] == "ngram: speculation off from 2 requests in flight"
