"""Never a traceback: a budget too small for any study still writes a profile that says
what was cut short; an unexpected failure or Ctrl-C is one line."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autotune.cli import app
from autotune.methods import registry
from autotune.profile.io import read_profile

pytestmark = pytest.mark.usefixtures("one_thread")

WORDS = ["cats", "rain", "maps", "tea", "ships", "glass", "bread", "stars"]
SMALL = {
    "self_spec": "calibration: {prompts: 2, tokens: 12}\ntrials: {prompts: 2, tokens: 8}\n",
    "medusa": "calibration: {prompts: 2, tokens: 12, max_rank: 4}\n"
    "tree: {max_nodes: 6, candidates: 2, trials: 2}\ntrials: {prompts: 2, tokens: 8}\n"
    "typical: {pairs: [[0.09, 0.3]], prompts: 1, tokens: 8}\n",
    "eagle": "calibration: {prompts: 2, tokens: 12, max_rank: 4, max_depth: 2, draft_vocab: [0]}\n"
    "static: {max_nodes: 6, candidates: 2, trials: 2}\ntrials: {prompts: 2, tokens: 8}\n",
    "cape": "calibration: {prompts: 2, tokens: 12}\nfine_bins: 5\nmax_expansion: 3\n"
    "max_verify_tokens: 8\nmax_chain_depth: 2\nselection: {prompts: 2, tokens: 8}\n",
}


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("AUTOTUNE_STORAGE", raising=False)
    monkeypatch.setenv("AUTOTUNE_CACHE", str(tmp_path / "cache"))
    (tmp_path / "prompts.jsonl").write_text(
        "".join(json.dumps({"prompt": f"Tell me about {w}."}) + "\n" for w in WORDS)
    )
    return tmp_path


def test_a_budget_too_small_for_any_study_still_writes_a_profile(workdir, tiny_llama_dir):
    from autotune.models.tiny import tiny_llama

    model = tiny_llama()
    args = [
        "profile",
        "--model",
        tiny_llama_dir,
        "--prompts",
        workdir / "prompts.jsonl",
        "--out",
        workdir / "p.yaml",
        "--methods",
        ",".join(SMALL),
        "--time-budget",
        1,
        "--heldback-prompts",
        2,
        "--max-new-tokens",
        8,
        "--select-prompts",
        2,
        "--storage",
        f"sqlite:///{workdir / 'db.sqlite'}",
    ]
    for name, text in SMALL.items():
        (workdir / f"{name}.yaml").write_text(text)
        args += ["--search-space", f"{name}={workdir / f'{name}.yaml'}"]
    for name in ("medusa", "eagle"):
        settings = next(iter(registry.method(name).examples(model, workdir).values()))
        folder = settings.heads if name == "medusa" else settings.head
        args += ["--heads", f"{name}={folder}"]
    result = invoke(*args)
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    profile = read_profile(workdir / "p.yaml")
    blocks = profile.method_blocks()
    assert set(blocks) == {"self_spec", "medusa", "eagle"}
    notes = {name: " ".join(block.notes) for name, block in blocks.items()}
    # each study was skipped, and each method fell back on its prediction, and says so
    assert "seed masks" in notes["self_spec"] and "proxy's static draft exit" in notes["self_spec"]
    assert "best predicted tree" in notes["medusa"] and "not run" in notes["medusa"]
    assert "best predicted tree" in notes["eagle"] and "dynamic-tree study" in notes["eagle"]
    # held back: the race's finalists, or the method ranked first when there are none
    measured = [block.measured for block in blocks.values() if block.measured is not None]
    assert measured and all(m.lossless is True and m.prompts == 2 for m in measured)
    assert all(block.selection is not None for block in blocks.values())
    assert "note: " in result.stdout and "recommended:" in result.stdout
    assert profile.verdict is not None and profile.verdict.reason


def test_an_unexpected_failure_is_one_line_and_a_log(workdir, tiny_llama_dir, monkeypatch):
    def broken(self, ctx):
        raise ValueError("an internal inconsistency")

    monkeypatch.setattr(type(registry.method("self_spec")), "tune", broken)
    result = invoke(
        "profile",
        "--model",
        tiny_llama_dir,
        "--methods",
        "self_spec",
        "--prompts",
        workdir / "prompts.jsonl",
        "--heldback-prompts",
        2,
        "--out",
        workdir / "p.yaml",
        "--storage",
        f"sqlite:///{workdir / 'db.sqlite'}",
    )
    assert result.exit_code == 1
    last = result.stderr.strip().splitlines()[-1]  # after the run's own progress lines
    assert last.startswith("error: ") and "ValueError: an internal inconsistency" in last
    assert "Traceback" not in result.stdout + result.stderr
    log = last.split("details are in ")[1].split(", please")[0]
    assert os.path.isfile(log) and "Traceback" in Path(log).read_text()
    assert not (workdir / "p.yaml").exists()


def test_ctrl_c_is_one_line(workdir, tiny_llama_dir, monkeypatch):
    def interrupted(self, ctx):
        raise KeyboardInterrupt

    monkeypatch.setattr(type(registry.method("self_spec")), "tune", interrupted)
    result = invoke(
        "profile",
        "--model",
        tiny_llama_dir,
        "--methods",
        "self_spec",
        "--prompts",
        workdir / "prompts.jsonl",
        "--heldback-prompts",
        2,
        "--out",
        workdir / "p.yaml",
        "--storage",
        f"sqlite:///{workdir / 'db.sqlite'}",
    )
    assert result.exit_code == 130
    assert result.stderr.strip().splitlines()[-1].startswith("interrupted:")
    assert "Traceback" not in result.stdout + result.stderr


# Each phase of an n-gram profile on the tiny model, interrupted as it begins: by Ctrl-C
# or by SIGTERM (what a container runtime or a job scheduler sends).
PHASES = ["answers", "probe ngram", "tune ngram", "held-back measurement"]


@pytest.mark.parametrize("how", ["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("phase", PHASES)
def test_an_interruption_in_any_phase_is_one_line_and_writes_nothing(
    workdir, tiny_llama_dir, monkeypatch, phase, how
):
    import signal

    from autotune.profiling import state

    begin, begun = state.begin, []

    def interrupting(run, name, *rest):
        begun.append(name)
        if name == phase:
            os.kill(os.getpid(), getattr(signal, how))
            time.sleep(5)  # the signal's handler ends the phase before this does
        return begin(run, name, *rest)

    monkeypatch.setattr(state, "begin", interrupting)
    # Ctrl-C as from a terminal: a suite started in the background inherits SIGINT
    # ignored, and the signal would then do nothing
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    before = sorted(p.name for p in workdir.iterdir() if p.name != "cache")
    try:
        result = invoke(
            "profile",
            "--model",
            tiny_llama_dir,
            "--methods",
            # a named method alone has no probe worth its time (``plan.probe_pays``)
            "ngram,self_spec" if phase == "probe ngram" else "ngram",
            "--prompts",
            workdir / "prompts.jsonl",
            "--out",
            workdir / "out" / "p.yaml",
            "--max-new-tokens",
            8,
            "--heldback-prompts",
            2,
            "--storage",
            f"sqlite:///{workdir / 'db.sqlite'}",
        )
    finally:
        signal.signal(signal.SIGINT, previous)
    assert phase in begun, begun  # the phase was reached
    assert result.exit_code == 130, (result.stdout, result.stderr, result.exception)
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("interrupted: no profile was written; "), last
    # what it says of the study is what the database holds
    kept = re.search(r"finished study trials are kept in \S+ \((\d+)\)", last)
    assert kept is not None or "no study trial had finished" in last, last
    assert "Traceback" not in result.stdout + result.stderr
    assert not (workdir / "out").exists()  # no profile, no plot, no temporary file
    # besides the study database (with SQLite's journal while Ray's workers still hold it
    # open) and autotune's cache, both kept for the next run, nothing
    kept = {"db.sqlite", "db.sqlite-wal", "db.sqlite-shm", "cache"}
    left = {p.name for p in workdir.iterdir()} - kept
    assert sorted(left) == before
