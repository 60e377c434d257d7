"""Bad input ends as one line that says what is wrong and what to do, exit status 2, and
no file left behind (issue 30): one table, each case a command line on inputs made in a
fresh folder. No model is loaded and no long work starts."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

import autotune.models
from autotune.cli import app
from autotune.cli.errors import user_errors
from autotune.methods import registry

DATA = Path(__file__).parent / "data"
PROFILE = DATA / "profile_smollm2-135m_self_spec.yaml"
# enough for profile's splits (22 hold back the 6 an interval needs), so that each case
# reaches the input it is about
PROMPTS = "".join(f'{{"prompt": "Tell me story {i}.", "id": "p{i}"}}\n' for i in range(24))


@dataclass(frozen=True)
class Case:
    name: str
    args: Callable[[Path], list]  # the command line, given the case's folder
    words: Callable[[Path], list]  # what the error line must name
    setup: Callable[[Path, pytest.MonkeyPatch], None] | None = None
    xfail: str | None = None  # the change it waits for, outside this module's reach


def broken_model(folder: Path) -> Path:
    model = folder / "broken-model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama",\n')
    return model


def small_model(folder: Path) -> Path:
    """A folder that resolves as a model (config.json only): enough to reach the study
    database, which is opened before the weights are loaded."""
    model = folder / "small-model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama"}')
    return model


def short_context_model(folder: Path) -> Path:
    """A model folder whose config.json gives a context of 256 positions."""
    model = folder / "short-model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama", "max_position_embeddings": 256}')
    return model


def prompts_file(folder: Path, count: int) -> Path:
    path = folder / f"{count}-prompts.jsonl"
    path.write_text("".join(f'{{"prompt": "Say {i}.", "id": "q{i}"}}\n' for i in range(count)))
    return path


def profile_of_one_prompt(folder: Path) -> Path:
    """SmolLM2-135M's profile made, it says, on a file of one prompt beside it."""
    prompts_file(folder, 1)
    path = folder / "one.yaml"
    path.write_text(
        PROFILE.read_text().replace("prompts: mt_bench.jsonl", "prompts: 1-prompts.jsonl")
    )
    return path


def heads_of_another_model(folder: Path) -> Path:
    """Medusa heads made for a model of hidden size 64 and 128 tokens (the tiny LLaMA)."""
    heads = folder / "tiny-heads"
    heads.mkdir()
    (heads / "config.json").write_text(
        '{"medusa_num_heads": 2, "hidden_size": 64, "vocab_size": 128}'
    )
    (heads / "medusa_lm_head.safetensors").write_bytes(b"")
    return heads


def wide_model(folder: Path) -> Path:
    """A model folder of SmolLM2-135M's shapes (config.json only)."""
    model = folder / "wide-model"
    model.mkdir()
    (model / "config.json").write_text(
        '{"model_type": "llama", "hidden_size": 576, "vocab_size": 49152}'
    )
    return model


def renamed_profile(folder: Path) -> Path:
    """SmolLM2-135M's profile (fingerprint, hidden size, vocabulary) claiming to be
    vicuna-7b with 40 layers."""
    text = PROFILE.read_text().replace("name: smollm2-135m", "name: vicuna-7b")
    path = folder / "renamed.yaml"
    path.write_text(text.replace("num_layers: 30", "num_layers: 40"))
    return path


def negative_grid(folder: Path) -> Path:
    path = folder / "space.yaml"
    path.write_text("ngram:\n  draft_tokens: [-3, 0]\n")
    return path


def disk_full(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """os.write writes half of what it is given, then the disk is full."""
    real = os.write
    calls = []

    def write(fd: int, data) -> int:
        calls.append(fd)
        if len(calls) > 1:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, bytes(data)[: max(1, len(data) // 2)])

    monkeypatch.setattr(os, "write", write)


def database_full(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Creating the tables fails once SQLite has made the file, as on a full disk."""
    import sqlalchemy as sa

    def create_all(self, bind, *args, **kwargs):
        with bind.connect() as conn:  # SQLite makes the (0-byte) file here
            conn.exec_driver_sql("PRAGMA user_version")
        raise sa.exc.OperationalError("CREATE TABLE", {}, Exception("database or disk is full"))

    monkeypatch.setattr(sa.MetaData, "create_all", create_all)


def profile_args(folder: Path, *more) -> list:
    return ["profile", "--prompts", folder / "prompts.jsonl", "--methods", "ngram", *more]


CASES = [
    Case(
        "profile --concurrency that is no list of request counts",
        lambda d: profile_args(d, "--concurrency", "1,two,4", "--out", d / "p.yaml"),
        lambda d: ["--concurrency '1,two,4'", "e.g. 1,2,4,8"],
    ),
    Case(
        "profile --engine of no engine",
        lambda d: profile_args(d, "--engine", "tgi", "--out", d / "p.yaml"),
        lambda d: ["unknown engine 'tgi'", "vllm"],
    ),
    Case(
        "profile --engine that serves none of the methods asked",
        lambda d: [
            *profile_args(d, "--out", d / "p.yaml"),
            "--methods",
            "medusa",
            "--engine",
            "llamacpp",
        ],
        lambda d: ["llamacpp", "medusa", "cannot serve"],
    ),
    Case(
        "model config.json not JSON (profile --model DIR)",
        lambda d: profile_args(d, "--model", broken_model(d), "--out", d / "p.yaml"),
        lambda d: [str(d / "broken-model" / "config.json"), "not valid JSON", "line 2"],
    ),
    Case(
        "model config.json not JSON (--model-path)",
        lambda d: profile_args(d, "--model", "vicuna-7b", "--model-path", broken_model(d)),
        lambda d: [str(d / "broken-model" / "config.json"), "not valid JSON"],
    ),
    Case(
        "model config.json not JSON (latency --random-weights)",
        lambda d: ["latency", "--random-weights", "--model", broken_model(d)],
        lambda d: ["config.json", "not valid JSON"],
    ),
    Case(
        "export --out in /proc",
        lambda d: ["export", PROFILE, "--engine", "hf", "--out", "/proc/x.txt"],
        lambda d: ["/proc/x.txt", "--out"],
    ),
    Case(
        "export onto a full disk",
        lambda d: ["export", PROFILE, "--engine", "hf", "--out", d / "out" / "x.json"],
        lambda d: [str(d / "out" / "x.json"), "no space left", "--out"],
        setup=disk_full,
    ),
    Case(
        "export --out under a file",
        lambda d: ["export", PROFILE, "--engine", "hf", "--out", d / "prompts.jsonl" / "x"],
        lambda d: [str(d / "prompts.jsonl"), "--out"],
    ),
    Case(
        "profile --out in /proc, refused before any work",
        lambda d: profile_args(d, "--out", "/proc/p.yaml"),
        lambda d: ["/proc/p.yaml", "--out"],
    ),
    Case(
        "profile: the study database cannot be created (full disk)",
        lambda d: profile_args(
            d, "--model", small_model(d), "--storage", f"sqlite:///{d / 'db' / 's.db'}"
        ),
        lambda d: [str(d / "db" / "s.db"), "disk is full", "--storage"],
        setup=database_full,
    ),
    Case(
        "--search-space with a negative draft length",
        lambda d: profile_args(d, "--search-space", f"ngram={negative_grid(d)}"),
        lambda d: [str(d / "space.yaml"), "draft_tokens"],
    ),
    Case(
        "profile: a prompts file of one prompt holds none back (issue 43)",
        lambda d: profile_args(d, "--prompts", prompts_file(d, 1), "--out", d / "p.yaml"),
        lambda d: [str(d / "1-prompts.jsonl"), "1 prompt:", "held-back", "at least 22 prompts"],
    ),
    Case(
        "profile: a held-back quarter too small for an interval",
        lambda d: profile_args(d, "--prompts", prompts_file(d, 8), "--out", d / "p.yaml"),
        lambda d: ["8 prompts", "held-back quarter is 2", "the 6", "--heldback-prompts 2"],
    ),
    Case(
        "profile: --max-new-tokens past the model's context",
        lambda d: profile_args(
            d, "--model", short_context_model(d), "--max-new-tokens", "300", "--out", d / "p.yaml"
        ),
        lambda d: ["short-model", "context is 256 tokens", "--max-new-tokens below 192"],
    ),
    Case(
        "profile --heads made for a model of other shapes",
        lambda d: profile_args(
            d,
            *("--model", wide_model(d), "--methods", "medusa", "--out", d / "p.yaml"),
            *("--heads", f"medusa={heads_of_another_model(d)}"),
        ),
        lambda d: [
            f"--heads medusa={d / 'tiny-heads'}",
            "hidden_size 64 (the model's 576)",
            "vocab_size 128 (the model's 49152)",
            "autotune heads train --kind medusa",
        ],
    ),
    Case(
        "heads train on a prompts file of one prompt",
        lambda d: [
            *("heads", "train", "--kind", "medusa", "--model", small_model(d)),
            *("--prompts", prompts_file(d, 1), "--out", d / "heads"),
        ],
        lambda d: [str(d / "1-prompts.jsonl"), "at least two"],
    ),
    Case(
        "heads train: --max-new-tokens past the model's context",
        lambda d: [
            *("heads", "train", "--kind", "eagle", "--model", short_context_model(d)),
            *("--max-new-tokens", "250", "--out", d / "heads"),
        ],
        lambda d: ["context is 256 tokens", "250 answer tokens", "--max-new-tokens below 192"],
    ),
    Case(
        "bench: the profile's prompts file holds none back",
        lambda d: ["bench", profile_of_one_prompt(d)],
        lambda d: [str(d / "1-prompts.jsonl"), "1 prompt", "hold any back", "--prompts"],
    ),
    Case(
        "bench --max-new-tokens past the context of the model it is pointed at",
        lambda d: [
            *("bench", PROFILE, "--model-path", short_context_model(d)),
            *("--max-new-tokens", "200"),
        ],
        lambda d: ["context is 256 tokens", "200 answer tokens", "--max-new-tokens below 192"],
    ),
    Case(
        "verify: the profile's prompts file holds none back",
        lambda d: ["verify", profile_of_one_prompt(d), "--engine", "hf", "--no-record"],
        lambda d: [str(d / "1-prompts.jsonl"), "1 prompt", "hold any back"],
    ),
    Case(
        "validate: a profile naming vicuna-7b with SmolLM2's shapes",
        lambda d: ["validate", renamed_profile(d)],
        lambda d: ["vicuna-7b", "num_layers 40", "smollm2-135m", "autotune profile"],
    ),
    Case(
        "export: a profile naming vicuna-7b with SmolLM2's shapes",
        lambda d: ["export", renamed_profile(d), "--engine", "hf", "--out", d / "x.json"],
        lambda d: ["vicuna-7b", "num_layers 40", "smollm2-135m"],
    ),
]


def files_under(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


@pytest.fixture
def folder(tmp_path, monkeypatch) -> Path:
    """The case's folder, also the current one, with caches and no study database from
    the environment; refuses model loading and tuning."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.delenv("HF_HOME", raising=False)
    monkeypatch.delenv("AUTOTUNE_STORAGE", raising=False)
    monkeypatch.setenv("AUTOTUNE_CACHE", str(tmp_path / "cache"))
    (tmp_path / "prompts.jsonl").write_text(PROMPTS)

    def refuse(*args, **kwargs):
        raise AssertionError("long work started")

    monkeypatch.setattr(autotune.models, "load_target", refuse)
    for entry in registry.methods().values():
        monkeypatch.setattr(type(entry), "tune", refuse)
    return tmp_path


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(c, id=c.name, marks=[pytest.mark.xfail(reason=c.xfail, strict=True)])
        if c.xfail
        else pytest.param(c, id=c.name)
        for c in CASES
    ],
)
def test_bad_input(case: Case, folder: Path, monkeypatch):
    args = [str(a) for a in case.args(folder)]
    before = files_under(folder)
    if case.setup is not None:
        case.setup(folder, monkeypatch)
    result = CliRunner().invoke(app, args)
    monkeypatch.undo()  # os.write and the rest back before anything else runs
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    lines = [line for line in result.stderr.splitlines() if not line.startswith("warning:")]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and "Traceback" not in result.output
    for word in case.words(folder):
        assert word in lines[0], (word, lines[0])
    shutil.rmtree(folder / "cache", ignore_errors=True)  # a log would be a bug's
    assert files_under(folder) == before


# --- SIGTERM ends a command as Ctrl-C does ---------------------------------------------

wait_app = typer.Typer()


@wait_app.command()
@user_errors
def wait(how: str) -> None:
    """Stands for a long command; SIGTERM reaches it as from ``kill``, or as after
    ray.init() (whose handler exits with the signal's number)."""
    if how == "ray":
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(signum))
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)
    raise AssertionError("SIGTERM did not stop the command")


@pytest.mark.parametrize("how", ["kill", "ray"])
def test_sigterm_is_an_interruption(how):
    before = signal.getsignal(signal.SIGTERM)
    result = CliRunner().invoke(wait_app, [how])
    assert result.exit_code == 130, (result.output, result.exception)
    # a command that says nothing of its own: it wrote nothing (no study to speak of)
    assert result.stderr.strip().splitlines() == ["interrupted: nothing was written"]
    assert signal.getsignal(signal.SIGTERM) is before  # put back when the command ends
