"""llama.cpp's ``llama-server``: built here for this CPU from a pinned source package,
proven on the embedded model, and run on a GGUF file with a speculative setting given as
its command-line flags.

The build takes the llama.cpp tree that the PyPI sdist of llama-cpp-python vendors (MIT
licensed, its release pinned below), configures it with CMake for this CPU and builds the
server target alone (about 4 minutes on 2 cores), into autotune's cache. Nothing but that
sdist is downloaded, from the package index pip already uses. Before the build is moved
into the cache it must serve a short completion (``llamacpp_proof``); the flags and build
that took are recorded in its release.json and every start of the server uses them.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from autotune.errors import AutotuneError
from autotune.files import write_atomic
from autotune.hardware import machine_key
from autotune.progress import say
from autotune.serving import llamacpp_proof, llamacpp_server
from autotune.serving.llamacpp_proof import Crashed, Proof, prove

SDIST = ("llama-cpp-python", "0.3.36")
COMMIT = "0c1e57098"  # the llama.cpp commit that sdist vendors (its CHANGELOG)
RELEASE = f"llama.cpp {COMMIT} (vendored in {SDIST[0]} {SDIST[1]})"
# The release's own recommended speculative default (its --spec-default: ngram-mod,
# n_match 24, n_min 48, n_max 64).
OWN_DEFAULT = ("--spec-default",)


def folder() -> Path:
    """Where this machine's build lives: per release and CPU (it is built for the CPU)."""
    from autotune.paths import cache_root

    # the CPU alone: torch's build and threads (also in machine_key, for autotune's own
    # kernels) do not change llama.cpp's binary, and a busy run's fewer threads must still
    # find the build
    key = machine_key()
    cpu = {name: key[name] for name in ("cpu", "machine")}
    digest = hashlib.sha256(json.dumps(cpu, sort_keys=True).encode()).hexdigest()
    return cache_root() / "engines" / f"llama.cpp-{COMMIT}-{digest[:12]}"


def server_path() -> Path:
    return folder() / "bin" / "llama-server"


def built() -> bool:
    return server_path().is_file()


def require_built() -> Path:
    if not built():
        raise AutotuneError(
            f"llama.cpp's llama-server ({RELEASE}) is not built on this machine: run "
            "`autotune engines build llamacpp` once (about 5 minutes, needs cmake and a "
            "C++ compiler)"
        )
    return server_path()


@dataclass(frozen=True)
class Built:
    """A proven build: where it is, what happened now (``built``, ``proven`` or
    ``already built and proven``) and its proof."""

    path: Path
    how: str
    proof: Proof

    def line(self) -> str:
        return f"{self.how}: {self.path} ({release()}; {self.proof.words()})"


def build(jobs: int | None = None, log=print) -> Built:
    """Build ``llama-server`` into the cache and prove it, unless a proven build is there;
    a build made before builds were proven is proven now, not rebuilt."""
    if built():
        proof = Proof.from_record(recorded())
        if proof is not None:
            return Built(server_path(), "already built and proven", proof)
        return _prove_earlier_build(jobs, log)
    _require_tools()
    llamacpp_proof.proof_model()  # refused now rather than after minutes of compiling
    return _build_proven(jobs, log, natives=(True, False))


def _prove_earlier_build(jobs: int | None, log) -> Built:
    """A build without a proof record: proven as it is, else rebuilt without native CPU
    features when it crashed even without weight repacking."""
    record = recorded()
    native = bool(record.get("native", True))
    log(f"proving the llama-server built earlier on this machine ({server_path()})")
    try:
        proof = prove(server_path(), native, log)
    except Crashed as crashed:
        if not native:
            raise _refusal(crashed) from None
        _require_tools()
        return _build_proven(jobs, log, natives=(False,), earlier=crashed.crashes)
    _write_record(folder(), {**record, **proof.record()})
    return Built(server_path(), "proven", proof)


def _build_proven(jobs: int | None, log, natives: Sequence[bool], earlier=()) -> Built:
    """Built for each of ``natives`` in turn (native CPU features on, then off) until a
    build passes its proof; it alone is moved into the cache, with its record."""
    target = folder()
    target.parent.mkdir(parents=True, exist_ok=True)
    crashes, last = list(earlier), None
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".build-") as work_dir:
        for native in natives:
            staged = _build_into(Path(work_dir), jobs or os.cpu_count() or 1, native, log)
            try:
                proof = prove(staged / "bin" / "llama-server", native, log, crashes)
            except Crashed as crashed:
                crashes, last = crashed.crashes, crashed
                continue
            _write_record(
                staged, {**json.loads((staged / "release.json").read_text()), **proof.record()}
            )
            if target.exists():  # a half-finished or crashing earlier build: replaced whole
                shutil.rmtree(target)
            staged.rename(target)
            return Built(server_path(), "built", proof)
    assert last is not None
    raise _refusal(last)


def _refusal(crashed: Crashed) -> AutotuneError:
    return AutotuneError(
        f"{crashed}; nothing was kept or recorded: serve with --engine hf, and report this "
        "with that log and this machine's CPU"
    )


def _require_tools() -> None:
    missing = [tool for tool in ("cmake", "c++") if shutil.which(tool) is None]
    if missing:
        raise AutotuneError(
            f"building llama.cpp needs {' and '.join(missing)}: install them (Debian: "
            "apt install cmake g++) and run again"
        )


def _build_into(work: Path, jobs: int, native: bool, log) -> Path:
    """The source package's llama-server built (with or without native CPU features)
    and staged in ``work`` with its license and release record: the staged folder."""
    source = work / "sdist-source"
    if not source.exists():
        log(f"downloading the {SDIST[0]} {SDIST[1]} source package (llama.cpp {COMMIT})")
        _unpack(_download(work), work).rename(source)
    if native:
        log("building llama-server for this CPU (about 4 minutes on 2 cores)")
    else:
        log("building llama-server again without native CPU features (about 4 minutes)")
    binary = _compile(source, work / f"build-native-{native}", jobs, native)
    staged = work / f"staged-native-{native}"
    (staged / "bin").mkdir(parents=True)
    shutil.copy2(binary, staged / "bin" / "llama-server")
    shutil.copy2(source / "LICENSE", staged / "LICENSE")
    record = {"release": RELEASE, "sdist": list(SDIST), "commit": COMMIT, "native": native}
    _write_record(staged, record)
    return staged


def recorded() -> dict:
    """This machine's build's release record ({} where there is none or it is unreadable:
    a build without a proof is proven again)."""
    with contextlib.suppress(OSError, ValueError):
        record = json.loads((folder() / "release.json").read_text())
        if isinstance(record, dict):
            return record
    return {}


def _write_record(build_folder: Path, record: dict) -> None:
    write_atomic(
        build_folder / "release.json",
        json.dumps(record, indent=1) + "\n",
        hint="free space in autotune's cache (AUTOTUNE_CACHE moves it)",
    )


def require_proven(log=say) -> Path:
    """This machine's build, proven first where it has no proof yet (a build made before
    builds were proven): as it is, else without weight repacking."""
    path = require_built()
    record = recorded()
    if Proof.from_record(record) is not None:
        return path
    log(f"proving llama-server on this machine before using it ({path})")
    try:
        proof = prove(path, bool(record.get("native", True)), log)
    except Crashed as crashed:
        raise AutotuneError(
            f"{crashed}; run `autotune engines build llamacpp` to rebuild it without "
            "native CPU features"
        ) from None
    _write_record(folder(), {**record, **proof.record()})
    log(f"llama-server {proof.words()}")
    return path


def server_flags() -> list[str]:
    """The flags this machine's build needs on every start (its proof's record)."""
    return [str(flag) for flag in recorded().get("server_flags", [])]


class Server(llamacpp_server.Server):
    """This machine's build serving ``gguf`` with ``flags`` (and those its proof needed),
    ``parallel`` slots, as long as the ``with`` block lasts. Every start of llama-server
    comes here, so that none goes without what the proof found."""

    def __init__(self, gguf: Path, flags: Sequence[str] = (), threads: int = 0, parallel: int = 1):
        binary = require_proven()
        super().__init__(binary, gguf, flags, threads, parallel, fixed=server_flags())

    def _died(self, phase: str) -> llamacpp_server.ServerDied:
        died = super()._died(phase)
        if died.build_suspect:
            _forget_proof()  # so that `engines build` (the line's advice) proves it again
        return died


def _forget_proof() -> None:
    """The build's proof dropped from its record (its flags kept until a new proof)."""
    record = recorded()
    if record.pop("proven", None) is not None:
        with contextlib.suppress(AutotuneError):  # unwritable: the crash is said anyway
            _write_record(folder(), record)


@contextlib.contextmanager
def servers(
    gguf: Path, variants: Mapping[str, Sequence[str]], threads: int = 0, parallel: int = 1
) -> Iterator[dict]:
    """A running server per variant (name -> flags), all stopped on leaving."""
    with contextlib.ExitStack() as stack:
        yield {
            name: stack.enter_context(Server(gguf, flags, threads, parallel))
            for name, flags in variants.items()
        }


def _download(work: Path) -> Path:
    spec = f"{SDIST[0]}=={SDIST[1]}"
    _run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
        + ["--disable-pip-version-check", "-d", str(work), spec],
        f"pip could not download {spec} (the package index must be reachable)",
    )
    found = sorted(work.glob("*.tar.gz"))
    if not found:
        raise AutotuneError(f"pip downloaded no source package of {spec}")
    return found[0]


def _unpack(archive: Path, work: Path) -> Path:
    with tarfile.open(archive) as tar:
        tar.extractall(work / "sdist", filter="data")
    roots = list((work / "sdist").glob("*/vendor/llama.cpp"))
    if not roots or not (roots[0] / "CMakeLists.txt").is_file():
        raise AutotuneError(f"{archive.name} holds no llama.cpp tree (vendor/llama.cpp)")
    source = roots[0]
    # the flags autotune's exports use: refuse a tree without them rather than fail later
    if "--spec-type" not in (source / "common" / "arg.cpp").read_text(errors="replace"):
        raise AutotuneError(f"the llama.cpp tree in {archive.name} has no --spec-type")
    return source


def _compile(source: Path, build_dir: Path, jobs: int, native: bool = True) -> Path:
    options = {
        "CMAKE_BUILD_TYPE": "Release",
        "BUILD_SHARED_LIBS": "OFF",  # one binary, movable into the cache
        # for this CPU, as autotune's own engine is; off where the native build crashed
        "GGML_NATIVE": "ON" if native else "OFF",
        "LLAMA_BUILD_SERVER": "ON",
        "LLAMA_BUILD_TESTS": "OFF",
        "LLAMA_BUILD_EXAMPLES": "OFF",
        "LLAMA_OPENSSL": "OFF",
    }
    _run(
        ["cmake", "-S", str(source), "-B", str(build_dir)]
        + [f"-D{key}={value}" for key, value in options.items()],
        "cmake could not configure llama.cpp",
    )
    _run(
        ["cmake", "--build", str(build_dir), "--target", "llama-server", "-j", str(jobs)],
        "llama.cpp's llama-server did not build",
    )
    binary = build_dir / "bin" / "llama-server"
    if not binary.is_file():
        raise AutotuneError(f"the llama.cpp build left no {binary}")
    return binary


def _run(command: list[str], failure: str) -> subprocess.CompletedProcess:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        raise AutotuneError(f"{failure}: {lines[-1] if lines else f'exit {done.returncode}'}")
    return done


def release() -> str:
    """The release of the build on this machine (the pinned one)."""
    return str(recorded().get("release", RELEASE))


def needs_draft_model(flags: Sequence[str]) -> bool:
    """Whether these flags draft with a draft model that they do not name."""
    pairs = itertools.pairwise(flags)
    drafts = any(a == "--spec-type" and b.startswith("draft-") for a, b in pairs)
    named = any(f in ("--spec-draft-model", "-md", "--model-draft") for f in flags)
    return drafts and not named


def flags_of(export_text: str) -> list[str]:
    """The flags of an exported llama.cpp flag file (comment lines left out)."""
    import shlex

    body = " ".join(
        line.rstrip("\\") for line in export_text.splitlines() if not line.startswith("#")
    )
    return shlex.split(body)
