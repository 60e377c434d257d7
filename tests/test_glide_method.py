"""The GLIDE method: its settings, its search's pure parts (the replayed grid, the study's
seeds, the fallback), its CAPE chain models, and its export for the reference code."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from autotune.budget import Budget
from autotune.drafters.cape import CODE_FLOOR10, PAPER_7531
from autotune.measure.cape_stats import ChainSteps
from autotune.measure.costs import LatencyCurve
from autotune.methods import registry
from autotune.methods.base import TuneContext
from autotune.methods.cape.settings import CapeSettings
from autotune.methods.glide.export import CANNOT, cape_table, reference_config, write_reference
from autotune.methods.glide.settings import GlideDraftExit, GlideSettings
from autotune.methods.glide.tune import Calibrated, predict, study_seeds, winner
from autotune.profile.io import read_profile, write_profile

DATA = Path(__file__).parent / "data"


def settings(**changes) -> GlideSettings:
    base = {"head": "heads/d", "draft": GlideDraftExit(max_tokens=4, exit_threshold=0.0)}
    return GlideSettings(**{**base, **changes})


def test_settings_give_the_drafters_exit_policy():
    block = settings(draft=GlideDraftExit(max_tokens=5, exit_threshold=0.35))
    policy = block.exit_policy()
    assert (policy.max_tokens, policy.exit_threshold, policy.adaptive) == (5, 0.35, None)
    assert block.exit_policy(depth=2).max_tokens == 2  # a CAPE chain's length replaces it
    with pytest.raises(ValueError):
        GlideDraftExit(max_tokens=0, exit_threshold=0.0)
    method = registry.method("glide")
    model = read_profile(DATA / "profile_smollm2-135m_eagle.yaml").model
    assert method.problems(settings(draft_vocab=4096), model) == []
    assert "exceed" in method.problems(settings(draft_vocab=10**6), model)[0]


def test_it_is_a_registered_chain_method_that_needs_a_draft(tmp_path):
    from autotune.errors import AutotuneError

    method = registry.method("glide")
    assert method.chain and method.heads == "glide" and not method.exporters
    with pytest.raises(
        AutotuneError, match="train a draft with `autotune heads train --kind glide`"
    ):
        method.check_heads(tmp_path)


# --- the search's pure parts -----------------------------------------------------------


def calibrated(depth: int = 8) -> Calibrated:
    """Chains of 40 roots whose first three steps are always right and the rest never,
    with confidence 0.9 on right steps and 0.2 on wrong ones."""
    ranks = np.where(np.arange(depth)[None] < 3, 0, 2).repeat(40, 0)
    confidences = np.where(ranks == 0, 0.9, 0.2)
    chains = [ChainSteps(confidences.astype(float), ranks)]
    return Calibrated([0, 1024], {0: chains, 1024: chains}, {0: 0.05, 1024: 0.02}, [], 1)


def space(**draft):
    from autotune.methods.glide.space import GlideSpace

    base = registry.get("glide").space()
    return GlideSpace.model_validate(
        {**base.model_dump(), "draft": {**base.draft.model_dump(), **draft}}
    )


def test_the_replayed_grid_finds_the_right_length_and_the_cheaper_vocabulary():
    curve = LatencyCurve([1.0] * 10)
    rows = predict(space(), calibrated(), curve)
    best = rows[0]
    # three right steps: a 3-token draft, or a longer one that exits at the first
    # unsure step (0.2 < threshold), cut short before paying for it
    assert best["vocab"] == 1024 and best["predicted_tokens_per_step"] == pytest.approx(4.0, 0.05)
    assert best["max_tokens"] == 3 or best["exit_threshold"] > 0.2
    lengths = {(r["vocab"], r["max_tokens"], r["exit_threshold"]) for r in rows}
    assert len(lengths) == len(rows)  # each setting once (length 1 takes no threshold)


def test_study_seeds_are_the_best_predictions_and_the_reference():
    rows = predict(space(candidates=2), calibrated(), LatencyCurve([1.0] * 10))
    seeds = study_seeds(space(candidates=2), rows)
    assert seeds[-1] == {"max_tokens": 4, "exit_threshold": 0.0, "vocab": 0}
    assert [s["max_tokens"] for s in seeds[:2]] == [r["max_tokens"] for r in rows[:2]]
    narrow = space(max_tokens=[1, 2], candidates=0)
    assert study_seeds(narrow, rows) == [{"max_tokens": 2, "exit_threshold": 0.0, "vocab": 0}]


class NoTrials:
    def get_trials(self, states=None):
        return []


def test_no_finished_trial_keeps_the_best_prediction_and_says_so():
    ctx = TuneContext(workspace=None, space=space(), budget=Budget(None), workers=None)  # type: ignore[arg-type]
    rows = predict(ctx.space, calibrated(), LatencyCurve([1.0] * 10))
    params = winner(ctx, NoTrials(), calibrated(), rows)
    assert params == {k: rows[0][k] for k in ("max_tokens", "exit_threshold", "vocab")}
    assert ctx.notes and "finished no trial" in ctx.notes[0]


# --- export -----------------------------------------------------------------------------


def test_cape_tables_in_the_references_form():
    code = CapeSettings.of(CODE_FLOOR10)
    assert cape_table(code) == ([8, 8, 8, 6, 6, 6, 4, 4, 2, 2, 2, 2], [])
    assert cape_table(CapeSettings.of(PAPER_7531))[0] == [7, 7, 7, 5, 5, 5, 3, 3, 1, 1, 1, 1]
    fitted = CapeSettings(bins=[0.35, 1.0], expansion=[4, 1])
    table, warnings = cape_table(fitted)
    assert table == [4, 4, 4, 4, 1, 1, 1, 1, 1, 1, 1, 1]  # [0.3, 0.4) takes p = 0.35
    assert "[0.35]" in warnings[0]


def test_reference_config_says_what_the_reference_cannot_do(tmp_path):
    from autotune.heads.glide import save_glide_draft
    from autotune.models import tiny
    from autotune.training.glide import new_draft

    model = tiny.tiny_llama()
    if getattr(model.config, "rope_parameters", None) is not None:  # transformers 5
        model.config.rope_parameters["rope_theta"] = 100000.0
    else:
        model.config.rope_theta = 100000.0
    folder = save_glide_draft(new_draft(model, 1), tmp_path / "d", "tiny")
    block = settings(
        head=str(folder),
        draft=GlideDraftExit(max_tokens=6, exit_threshold=0.4),
        draft_vocab=1024,
        cape=CapeSettings.of(CODE_FLOOR10, chain_depth=3),
    )
    config, warnings, notes = reference_config(block)
    assert config["num_draft_tokens"] == 3 and config["cape"]["bin"][0] == 8
    assert config["draft_model"] == str(folder)
    text = " ".join(warnings)
    for words in ("drafts 4 tokens", "no draft exit", "whole vocabulary", "autotune's layout"):
        assert words in text
    assert "RoPE base 10000" in text and "100000" in text
    assert notes == ["run with expand_cape and --bin 8 8 8 6 6 6 4 4 2 2 2 2"]
    plain, warnings, _ = reference_config(settings(head=str(tmp_path / "elsewhere")))
    assert warnings == [] and plain["cape"] is None and plain["num_draft_tokens"] == 4


def test_writer_reads_a_profile_and_writes_json(tmp_path, capsys):
    profile = read_profile(DATA / "profile_smollm2-135m_eagle.yaml")
    measured = profile.methods.eagle.measured
    profile.methods.glide = settings(draft=GlideDraftExit(max_tokens=5, exit_threshold=0.0))
    profile.methods.glide.measured = measured
    path = tmp_path / "p.yaml"
    write_profile(profile, path)
    out = tmp_path / "glide.json"
    warnings = write_reference(path, out)
    data = json.loads(out.read_text())
    assert data["num_draft_tokens"] == 5 and data["_autotune"]["warnings"] == warnings
    assert "GliDe_with_a_CaPE" in data["_autotune"]["engine_version"]
    assert any("measured in autotune's engine" in line for line in data["_autotune"]["provenance"])
    write_reference(path)
    assert json.loads(capsys.readouterr().out)["method"] == "glide"


def test_writer_errors_are_one_line(tmp_path, capsys):
    from autotune.methods.glide.export import main

    profile = read_profile(DATA / "profile_smollm2-135m_eagle.yaml")
    write_profile(profile, tmp_path / "p.yaml")
    assert main([str(tmp_path / "p.yaml")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "has no glide method" in err


def test_every_engine_says_why_it_cannot_serve_glide():
    from autotune.export import ENGINES

    assert set(CANNOT) == set(ENGINES) and all(CANNOT.values())


# --- end to end -------------------------------------------------------------------------

SMALL_GLIDE_SPACE = """\
calibration: {prompts: 3, tokens: 16, max_depth: 4, draft_vocab: [0, 24]}
draft: {max_tokens: [1, 4], exit_threshold: [0.0, 0.8], candidates: 2, trials: 3}
trials: {prompts: 2, tokens: 10}
"""
WORDS = ["cats", "rain", "maps", "tea", "ships", "glass", "bread", "stars", "bees", "clay"]


@pytest.mark.ray
def test_glide_profile_with_cape_and_bench_end_to_end(
    tmp_path, tiny_llama, tiny_llama_dir, run_autotune
):
    from autotune.heads.eagle import save_draft_vocab
    from autotune.heads.glide import save_glide_draft
    from autotune.training.glide import new_draft

    folder = save_glide_draft(new_draft(tiny_llama, 1), tmp_path / "draft", "tiny")
    save_draft_vocab(folder, {token: 100 - token for token in range(3, 60)})
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join(json.dumps({"prompt": f"Tell me about {w}.", "id": w}) + "\n" for w in WORDS)
    )
    (tmp_path / "glide.yaml").write_text(SMALL_GLIDE_SPACE)
    (tmp_path / "cape.yaml").write_text(
        "calibration: {prompts: 2, tokens: 12}\nfine_bins: 10\nmax_expansion: 4\n"
        "max_chain_depth: 3\nselection: {prompts: 2, tokens: 8}\n"
    )
    out = tmp_path / "p.yaml"
    done = run_autotune(
        [
            *("profile", "--model", tiny_llama_dir, "--methods", "glide,cape"),
            *("--heads", f"glide={folder}", "--prompts", prompts, "--out", out),
            *("--search-space", f"glide={tmp_path / 'glide.yaml'}"),
            *("--search-space", f"cape={tmp_path / 'cape.yaml'}"),
            *("--storage", f"sqlite:///{tmp_path / 'db.sqlite'}", "--time-budget", 200),
            *("--threads", 1, "--heldback-prompts", 2, "--max-new-tokens", 12),
        ],
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    block = read_profile(out).methods.glide
    assert block is not None and block.measured.lossless is True
    assert 1 <= block.draft.max_tokens <= 4 and block.draft_vocab in (0, 24)
    assert set(block.search["draft_vocab"]) == {"0", "24"} and block.search["trials"]
    assert "/glide/" in block.study
    cape = block.cape
    assert cape is not None and 1 <= cape.chain_depth <= 4 and max(cape.expansion) <= 4
    selection = cape.search["selection_on_search_prompts"]
    assert cape.enabled == (selection["with"] > selection["without"])
    bench = run_autotune(
        ["bench", out, "--json", "--max-new-tokens", 10, "--prompts", prompts, "--threads", 1],
        cwd=tmp_path,
    )
    assert bench.returncode == 0, bench.stderr[-3000:]
    assert json.loads(bench.stdout)["glide"]["lossless"] is True
