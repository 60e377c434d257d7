"""`autotune profile` and `bench` end to end on the tiny model, through Ray: a profile
tuned with layer-skip and CAPE, then benched; a relative model folder; heads trained
within the run's budget."""

from __future__ import annotations

import json

import pytest
from test_cli import HELDBACK, SMALL_SPACE, write_prompts

from autotune.profile.io import read_profile

SMALL_CAPE_SPACE = """\
calibration: {prompts: 2, tokens: 16}
fine_bins: 10
max_expansion: 4
max_verify_tokens: 12
max_chain_depth: 3
selection: {prompts: 2, tokens: 8}
"""

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.ray
def test_profile_and_bench_end_to_end(tmp_path, tiny_llama_dir, run_autotune):
    run_cli = run_autotune
    prompts = write_prompts(tmp_path / "prompts.jsonl")
    space = tmp_path / "space.yaml"
    space.write_text(SMALL_SPACE)
    cape_space = tmp_path / "cape.yaml"
    cape_space.write_text(SMALL_CAPE_SPACE)
    out = tmp_path / "p.yaml"
    db = tmp_path / "db" / "studies.db"
    done = run_cli(
        [
            "profile",
            "--model",
            tiny_llama_dir,
            "--methods",
            "self-spec,cape",
            "--trials",
            4,
            "--time-budget",
            60,
            "--storage",
            f"sqlite:///{db}",
            "--out",
            out,
            "--prompts",
            prompts,
            "--search-space",
            f"self_spec={space}",
            "--search-space",
            f"cape={cape_space}",
            "--threads",
            1,
            *HELDBACK,
        ],
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"wrote {out}" in done.stdout
    profile = read_profile(out)
    block = profile.methods.self_spec
    assert block is not None
    assert block.measured.lossless is True
    assert block.measured.prompts == 2
    assert block.measured.speedup > 0 and block.measured.tokens_per_step >= 1.0
    assert profile.recommended in ("none", "self_spec")
    # recommended exactly when it ranked first and its held-back interval clears 1.0
    clears = block.selection.speedup > 1.0 and block.measured.speedup_interval[0] > 1.0
    assert profile.recommended == ("self_spec" if clears else "none")
    assert block.skip.attention or block.skip.mlp
    assert set(block.skip.attention) | set(block.skip.mlp) <= {1, 2}  # keep_first/last 1
    assert 1 <= block.draft.max_tokens <= 8
    assert block.search  # how the setting was found is recorded
    # the verify curve it was tuned on, relative to one token and to this machine's floor
    assert len(block.search["verify_floor_ratio"]) == len(block.search["verify_cost_relative"])
    assert profile.model.num_layers == 4 and profile.hardware.threads == 1
    assert db.is_file()
    cape = block.cape  # fitted on the tuned layer-skip drafter, kept if it decoded faster
    assert cape is not None and cape.measured is None
    assert cape.bins[-1] == 1.0 and len(cape.bins) == len(cape.expansion)
    assert max(cape.expansion) <= 4 and cape.max_verify_tokens == 12
    assert cape.predicted_speedup > 0 and cape.search["replays"] > 1
    selection = cape.search["selection_on_search_prompts"]
    assert cape.enabled == (selection["with"] > selection["without"])
    assert ("self_spec keeps cape" in done.stdout) == cape.enabled

    bench = run_cli(
        ["bench", out, "--json", "--max-new-tokens", 12, "--prompts", prompts, "--threads", 1],
        cwd=tmp_path,
    )
    assert bench.returncode == 0, bench.stderr[-3000:]
    figures = json.loads(bench.stdout)
    assert set(figures) - {"recommended", "recommended_holds"} == {"self_spec"}
    row = figures["self_spec"]
    for key in ("speedup", "tokens_per_step", "tokens_per_s", "baseline_tokens_per_s", "lossless"):
        assert key in row, key
    assert row["lossless"] is True
    assert row["tokens_per_s"] > 0 and row["baseline_tokens_per_s"] > 0
    assert row["speedup"] == pytest.approx(
        row["tokens_per_s"] / row["baseline_tokens_per_s"], rel=1e-2
    )
    assert row["tokens_per_step"] >= 1.0
    assert row["prompts"] == 8


@pytest.mark.ray
def test_profile_with_relative_model_folder(tmp_path, tiny_llama_dir, run_autotune):
    run_cli = run_autotune
    prompts = write_prompts(tmp_path / "prompts.jsonl")
    space = tmp_path / "space.yaml"
    space.write_text(SMALL_SPACE)
    done = run_cli(
        [
            "profile",
            "--model",
            tiny_llama_dir.name,
            "--trials",
            2,
            "--methods",
            "self_spec",
            "--time-budget",
            120,
            "--storage",
            f"sqlite:///{tmp_path / 'x.db'}",
            "--out",
            tmp_path / "p.yaml",
            "--prompts",
            prompts,
            "--search-space",
            f"self_spec={space}",
            "--threads",
            1,
            *HELDBACK,
        ],
        cwd=tiny_llama_dir.parent,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert read_profile(tmp_path / "p.yaml").methods.self_spec is not None


WORDS = [
    f"{thing} {n}"
    for n in range(2)
    for thing in ("rain", "snow", "the sea", "birds", "maps", "ships", "trees", "cats")
]


@pytest.mark.ray
def test_profile_trains_missing_heads_within_its_budget(tmp_path, tiny_llama_dir, run_autotune):
    """No heads given or found: `profile` plans the time, trains them on the shared
    answers, keeps them in its heads cache, measures the method, and the next run finds
    them there instead of training again."""
    # enough prompts that a third of the search split, unseen by the heads, measures them
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join(json.dumps({"prompt": f"Tell me about {w}.", "id": w}) + "\n" for w in WORDS)
    )
    out = tmp_path / "p.yaml"
    args = [
        "profile",
        "--model",
        tiny_llama_dir,
        "--methods",
        "medusa",
        "--budget",
        "4m",
        "--prompts",
        prompts,
        "--out",
        out,
        "--select-prompts",
        "2",
        "--threads",
        1,
        "--storage",
        f"sqlite:///{tmp_path / 'studies.db'}",
        *HELDBACK,
    ]
    done = run_autotune(args, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "plan:" in done.stderr and "train medusa heads" in done.stderr
    profile = read_profile(out)
    block = profile.methods.medusa
    assert block is not None and block.measured is not None and block.measured.lossless
    assert "speedup" in done.stdout and "medusa" in done.stdout  # the verdict table
    assert (tmp_path / "p.png").stat().st_size > 0  # the verdict's picture
    heads = sorted((tmp_path / "cache" / "heads").glob("*/medusa/config.json"))
    assert len(heads) == 1
    again = run_autotune(args, cwd=tmp_path, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "heads from autotune's heads cache" in again.stderr.replace("\n", " ")
    assert "train medusa heads" not in again.stderr
