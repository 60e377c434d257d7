"""A built llama-server is proven before it is used (issue 43, item 4), with stand-in
servers: small Python scripts put where the build puts llama-server, that crash as an AMX
Xeon's build does (SIGSEGV while loading, unless --no-repack), always, never, or in the
middle of a request. The build retries a crash without weight repacking, then rebuilt
without native CPU features (the rebuild a stand-in too), records what was needed, says
it in one line, and every later start uses it; a server that dies is one line naming its
signal or exit code and the likely cause, its log kept."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autotune.cli import app
from autotune.errors import AutotuneError
from autotune.paths import cache_root
from autotune.serving import llamacpp, llamacpp_proof
from autotune.serving.llamacpp_server import ServerDied

USER_CACHE = cache_root()  # the session's, before a test moves it: converted models there
# The stand-in: MODE says how it behaves; every start appends its arguments to STARTS.
STANDIN = """#!{python}
import json, os, signal, sys
from http.server import BaseHTTPRequestHandler, HTTPServer

MODE = {mode!r}
with open({starts!r}, "a") as starts:
    starts.write(json.dumps(sys.argv[1:]) + "\\n")
print("init: llama threadpool init, n_threads = 2", flush=True)


def die(how):
    if how == "exit":
        print("error: failed to load the model", flush=True)
        os._exit(1)
    number = getattr(signal, how)
    if number != signal.SIGKILL:  # a handler of its own cannot be set, nor is one there
        signal.signal(number, signal.SIG_DFL)
    os.kill(os.getpid(), number)


if MODE == "segv" or (MODE == "segv-unless-no-repack" and "--no-repack" not in sys.argv):
    die("SIGSEGV")
if MODE == "refuses":
    die("exit")


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        self.reply({{"status": "ok"}})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if MODE.startswith("dies-serving-"):
            die(MODE.removeprefix("dies-serving-"))
        tokens = list(range(1, body["n_predict"] + 1))
        self.reply({{"tokens": tokens, "timings": {{"predicted_ms": 1.0}}}})

    def reply(self, answer):
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


port = int(sys.argv[sys.argv.index("--port") + 1])
HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


def standin(path: Path, mode: str, starts: Path) -> Path:
    """A stand-in llama-server at ``path`` that behaves as ``mode`` says."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(STANDIN.format(python=sys.executable, mode=mode, starts=str(starts)))
    path.chmod(0o755)
    return path


def starts_of(folder: Path) -> list[list[str]]:
    """The arguments of every start of a stand-in, in order."""
    path = folder / "starts.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache of its own, a model file to prove on (the stand-ins never read it), and no
    compiler needed: every build is a stand-in's."""
    monkeypatch.setenv("AUTOTUNE_CACHE", str(tmp_path / "cache"))
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    monkeypatch.setattr(llamacpp_proof, "proof_model", lambda: ("smollm2-135m", model))
    monkeypatch.setattr(llamacpp, "_require_tools", lambda: None)
    return tmp_path


def earlier_build(folder: Path, mode: str, proof: dict | None = None) -> dict:
    """A build already in the cache, as one made before builds were proven (or with
    ``proof``, a record's fields): its release record."""
    standin(llamacpp.server_path(), mode, folder / "starts.jsonl")
    record = {"release": llamacpp.RELEASE, "commit": llamacpp.COMMIT, **(proof or {})}
    (llamacpp.folder() / "release.json").write_text(json.dumps(record))
    return record


def stand_in_rebuilds(folder: Path, monkeypatch: pytest.MonkeyPatch, modes: dict) -> list:
    """Builds (native CPU features on, off) that stage a stand-in of ``modes[native]``
    instead of compiling; the natives built, in order."""
    made: list[bool] = []

    def build_into(work: Path, jobs: int, native: bool, log) -> Path:
        made.append(native)
        staged = work / f"staged-native-{native}"
        standin(staged / "bin" / "llama-server", modes[native], folder / "starts.jsonl")
        record = {"release": llamacpp.RELEASE, "native": native}
        (staged / "release.json").write_text(json.dumps(record))
        return staged

    monkeypatch.setattr(llamacpp, "_build_into", build_into)
    return made


@dataclass(frozen=True)
class Case:
    name: str
    earlier: str | None  # the mode of a build already there (made before proofs), if any
    builds: dict  # native (True/False) -> the mode of the stand-in that build makes
    status: int
    words: list[str]  # what the one line must say
    recorded: dict | None  # the proof's record afterwards: server_flags and native
    rebuilt: list[bool]  # the builds made, in order (native on, off)


CASES = [
    Case(
        "a fresh build that crashes with weight repacking is kept with --no-repack",
        earlier=None,
        builds={True: "segv-unless-no-repack"},
        status=0,
        words=[
            "built: ",
            "proven on smollm2-135m; needed --no-repack: the server crashed",
            "SIGSEGV (signal 11) while loading the model with weight repacking",
        ],
        recorded={"server_flags": ["--no-repack"], "native": True},
        rebuilt=[True],
    ),
    Case(
        "an earlier build that crashes with weight repacking is proven, not rebuilt",
        earlier="segv-unless-no-repack",
        builds={},
        status=0,
        words=["proven: ", "needed --no-repack", "SIGSEGV (signal 11)"],
        recorded={"server_flags": ["--no-repack"], "native": True},
        rebuilt=[],
    ),
    Case(
        "an earlier build that always crashes is rebuilt without native CPU features",
        earlier="segv",
        builds={False: "serves"},
        status=0,
        words=[
            "built: ",
            "needed --no-repack and a build without native CPU features",
            "with weight repacking, and with SIGSEGV (signal 11) while loading the "
            "model without weight repacking",
        ],
        recorded={"server_flags": ["--no-repack"], "native": False},
        rebuilt=[False],
    ),
    Case(
        "a fresh build that crashes every way is refused, nothing kept",
        earlier=None,
        builds={True: "segv", False: "segv"},
        status=2,
        words=[
            "llama-server crashed on this machine with SIGSEGV (signal 11)",
            "without weight repacking or native CPU features",
            "nothing was kept",
        ],
        recorded=None,
        rebuilt=[True, False],
    ),
    Case(
        "an earlier build that crashes every way is refused, its record untouched",
        earlier="segv",
        builds={False: "segv"},
        status=2,
        words=[
            "SIGSEGV (signal 11) while loading the model with weight repacking",
            "nothing was kept or recorded",
        ],
        recorded=None,
        rebuilt=[False],
    ),
    Case(
        "a build that serves at once is proven as it is",
        earlier=None,
        builds={True: "serves"},
        status=0,
        words=["built: ", "proven on smollm2-135m: a 4-token greedy completion"],
        recorded={"server_flags": [], "native": True},
        rebuilt=[True],
    ),
    Case(
        "a build that refuses the model (an exit code, no crash) is not retried",
        earlier="refuses",
        builds={},
        status=2,
        words=[
            "llama-server refused no flags (exit code 1)",
            "failed to load the model",
            "its log: ",
        ],
        recorded=None,
        rebuilt=[],
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_a_build_is_proven_before_it_is_used(case: Case, folder: Path, monkeypatch):
    before = earlier_build(folder, case.earlier) if case.earlier else None
    made = stand_in_rebuilds(folder, monkeypatch, case.builds)
    result = CliRunner().invoke(app, ["engines", "build", "llamacpp"])
    assert result.exit_code == case.status, (result.output, result.exception)
    lines = result.stdout.splitlines() if case.status == 0 else result.stderr.splitlines()
    line = lines[-1]
    assert "Traceback" not in result.output and "threadpool" not in line
    for word in case.words:
        assert word in line, (word, line)
    assert made == case.rebuilt
    assert not list((folder / "cache" / "engines").glob(".build-*"))  # no staging left
    if case.recorded is None:  # nothing half-recorded: as it was, or no build at all
        record = llamacpp.recorded()
        assert record == (before or {}) and (llamacpp.built() == (before is not None))
        return
    proof = llamacpp.recorded()
    assert {k: proof[k] for k in case.recorded} == case.recorded
    assert proof["proven"]["model"] == "smollm2-135m"
    # every later start passes what the proof needed
    with llamacpp.Server(folder / "model.gguf", ["--spec-default"]) as server:
        assert server.decode([1, 2], 3).tokens == [1, 2, 3]
    last = starts_of(folder)[-1]
    assert last[-1] == "--spec-default"
    assert ("--no-repack" in last) == ("--no-repack" in case.recorded["server_flags"])


def test_a_proven_build_is_said_so_and_not_started(folder: Path, monkeypatch):
    proof = {"server_flags": ["--no-repack"], "native": True}
    proven = {"model": "smollm2-135m", "tokens": 4, "at": "", "crashes": ["SIGSEGV x"]}
    earlier_build(folder, "segv", {**proof, "proven": proven})
    made = stand_in_rebuilds(folder, monkeypatch, {})
    result = CliRunner().invoke(app, ["engines", "build", "llamacpp"])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        f"already built and proven: {llamacpp.server_path()} ({llamacpp.RELEASE}; proven "
        "on smollm2-135m; needed --no-repack: the server crashed with SIGSEGV x)"
    ]
    assert made == [] and starts_of(folder) == []


def test_a_build_is_proven_on_first_use_and_not_again(folder: Path):
    """verify, tuning and the benchmarks start servers through llamacpp.Server: an earlier
    build without a proof is proven there before the first one is used."""
    earlier_build(folder, "segv-unless-no-repack")
    said: list[str] = []
    llamacpp.require_proven(log=said.append)
    assert "needed --no-repack" in said[-1] and llamacpp.server_flags() == ["--no-repack"]
    proofs = len(starts_of(folder))
    assert proofs == 2  # as built (crashed), then without repacking
    with llamacpp.servers(folder / "model.gguf", {"a": [], "b": ["--spec-default"]}) as running:
        assert set(running) == {"a", "b"}
    assert len(starts_of(folder)) == proofs + 2  # no proof again
    assert all("--no-repack" in start for start in starts_of(folder)[proofs:])


def test_a_build_crashing_every_way_on_first_use_says_to_rebuild(folder: Path):
    record = earlier_build(folder, "segv")
    with pytest.raises(AutotuneError) as error:
        llamacpp.require_proven(log=lambda line: None)
    line = str(error.value)
    assert "SIGSEGV (signal 11) while loading the model without weight repacking" in line
    assert "`autotune engines build llamacpp` to rebuild it without native CPU" in line
    assert "\n" not in line and llamacpp.recorded() == record


@dataclass(frozen=True)
class Death:
    name: str
    mode: str  # the stand-in's
    words: list[str]
    reproves: bool  # the build is suspect: its proof dropped, so the next use proves it


DEATHS = [
    Death(
        "a crash mid-request is its signal and cause, not the last log line",
        "dies-serving-SIGSEGV",
        [
            "llama-server died with SIGSEGV (signal 11) while serving a request",
            "a crash in its CPU code",
            "run `autotune engines build llamacpp` to re-prove it",
        ],
        reproves=True,
    ),
    Death(
        "a kill from outside is said as one, out of memory the likely cause",
        "dies-serving-SIGKILL",
        ["died with SIGKILL (signal 9) while serving a request", "memory runs out"],
        reproves=False,
    ),
    Death(
        "an exit mid-request is its exit code",
        "dies-serving-exit",
        ["llama-server exited while serving a request (exit code 1)", "failed to load"],
        reproves=False,
    ),
]


@pytest.mark.parametrize("death", DEATHS, ids=lambda d: d.name)
def test_a_server_dying_is_one_line_with_its_log_kept(death: Death, folder: Path):
    proven = {"model": "smollm2-135m", "tokens": 4, "at": "", "crashes": []}
    earlier_build(folder, death.mode, {"server_flags": [], "native": True, "proven": proven})
    with pytest.raises(ServerDied) as error, llamacpp.Server(folder / "model.gguf") as server:
        server.decode([1, 2], 4)
    line = str(error.value)
    for word in death.words:
        assert word in line, (word, line)
    assert "\n" not in line and "threadpool" not in line.split("(its log")[0]
    log = Path(line.rsplit("its log: ", 1)[1].rstrip(")"))
    assert log.parent == folder / "cache" / "logs" and "threadpool" in log.read_text()
    assert ("proven" not in llamacpp.recorded()) == death.reproves
    assert llamacpp.recorded()["server_flags"] == []  # kept until a new proof


@pytest.mark.embedded
def test_verify_names_the_signal_of_a_server_dying_mid_run(folder: Path, monkeypatch):
    """`autotune verify --engine llamacpp` with a server that crashes on its first request:
    the one line names the signal and what to do (it said the last log line before)."""
    from test_ngram_export import TREE, ngram_profile

    from autotune.models import resolve_model
    from autotune.profile.io import write_profile

    try:
        resolve_model("smollm2-135m")
    except AutotuneError:
        pytest.skip("the embedded model is not installed")
    proven = {"model": "smollm2-135m", "tokens": 4, "at": "", "crashes": []}
    proof = {"server_flags": ["--no-repack"], "native": True, "proven": proven}
    earlier_build(folder, "dies-serving-SIGSEGV", proof)
    for kept in ("models", "kernels"):  # the model's conversion and kernel table, not redone
        if (USER_CACHE / kept).is_dir():
            (folder / "cache" / kept).symlink_to(USER_CACHE / kept)
    profile = ngram_profile(TREE)
    profile.workload.prompts = "mt_bench.jsonl"
    write_profile(profile, folder / "profile.yaml")
    args = ["verify", str(folder / "profile.yaml"), "--engine", "llamacpp", "--limit", "1"]
    result = CliRunner().invoke(app, [*args, "--max-new-tokens", "4"])
    assert result.exit_code == 2, (result.output, result.exception)
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("error: llama-server died with SIGSEGV (signal 11) while serving")
    assert "autotune engines build llamacpp" in line and "Traceback" not in result.output
    assert all("--no-repack" in start for start in starts_of(folder))
    assert os.path.exists(line.rsplit("its log: ", 1)[1].rstrip(")"))


def test_the_build_is_found_whatever_torch_threads_a_run_uses():
    # a busy run sets fewer threads; the binary is the CPU's, not the run's
    import torch

    from autotune.serving import llamacpp

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = llamacpp.folder()
        torch.set_num_threads(max(2, before))
        assert llamacpp.folder() == one
    finally:
        torch.set_num_threads(before)
