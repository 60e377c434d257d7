"""llama.cpp's ``llama-server``: built here for this CPU from a pinned source package, and
run on a GGUF file with a speculative setting given as its command-line flags.

The build takes the llama.cpp tree that the PyPI sdist of llama-cpp-python vendors (MIT
licensed, its release pinned below), configures it with CMake for this CPU and builds the
server target alone (about 4 minutes on 2 cores), into autotune's cache. Nothing but that
sdist is downloaded, from the package index pip already uses.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from autotune.errors import AutotuneError
from autotune.hardware import machine_key
from autotune.serving import Decoded

SDIST = ("llama-cpp-python", "0.3.36")
COMMIT = "0c1e57098"  # the llama.cpp commit that sdist vendors (its CHANGELOG)
RELEASE = f"llama.cpp {COMMIT} (vendored in {SDIST[0]} {SDIST[1]})"
# The release's own recommended speculative default (its --spec-default: ngram-mod,
# n_match 24, n_min 48, n_max 64).
OWN_DEFAULT = ("--spec-default",)
START_TIMEOUT_S = 60.0
REQUEST_TIMEOUT_S = 600.0


def folder() -> Path:
    """Where this machine's build lives: per release and CPU (it is built for the CPU)."""
    from autotune.paths import cache_root

    digest = hashlib.sha256(json.dumps(machine_key(), sort_keys=True).encode()).hexdigest()
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


def build(jobs: int | None = None, log=print) -> Path:
    """Build ``llama-server`` into the cache unless it is there; its path."""
    if built():
        return server_path()
    missing = [tool for tool in ("cmake", "c++") if shutil.which(tool) is None]
    if missing:
        raise AutotuneError(
            f"building llama.cpp needs {' and '.join(missing)}: install them (Debian: "
            "apt install cmake g++) and run again"
        )
    target = folder()
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".build-") as work_dir:
        work = Path(work_dir)
        log(f"downloading the {SDIST[0]} {SDIST[1]} source package (llama.cpp {COMMIT})")
        source = _unpack(_download(work), work)
        log("building llama-server for this CPU (about 4 minutes on 2 cores)")
        binary = _compile(source, work / "build", jobs or os.cpu_count() or 1)
        staged = work / "staged"
        (staged / "bin").mkdir(parents=True)
        shutil.copy2(binary, staged / "bin" / "llama-server")
        shutil.copy2(source / "LICENSE", staged / "LICENSE")
        record = {"release": RELEASE, "sdist": list(SDIST), "commit": COMMIT}
        (staged / "release.json").write_text(json.dumps(record, indent=1) + "\n")
        if target.exists():  # a half-finished earlier build: replaced whole
            shutil.rmtree(target)
        staged.rename(target)
    return server_path()


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


def _compile(source: Path, build_dir: Path, jobs: int) -> Path:
    options = {
        "CMAKE_BUILD_TYPE": "Release",
        "BUILD_SHARED_LIBS": "OFF",  # one binary, movable into the cache
        "GGML_NATIVE": "ON",  # for this CPU, as autotune's own engine is
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
    record = folder() / "release.json"
    with contextlib.suppress(OSError, ValueError):
        return json.loads(record.read_text())["release"]
    return RELEASE


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


SLOT_CONTEXT = 4096  # tokens of context each slot of a many-slot server gets


class Server:
    """One ``llama-server`` process on a loopback port, with ``parallel`` slots (requests
    it decodes at once, batched), as long as the ``with`` block lasts."""

    def __init__(self, gguf: Path, flags: Sequence[str] = (), threads: int = 0, parallel: int = 1):
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.flags = list(flags)
        # the server splits its context among its slots: each keeps room for a prompt
        context = ("--ctx-size", str(parallel * SLOT_CONTEXT)) if parallel > 1 else ()
        self.command = [
            str(require_built()),
            *("--model", str(gguf), "--host", "127.0.0.1", "--port", str(port)),
            *("--threads", str(threads or os.cpu_count() or 1), "--parallel", str(parallel)),
            *context,
            *self.flags,
        ]
        self._process: subprocess.Popen | None = None
        self._log: Any = None

    def __enter__(self) -> Server:
        self._log = tempfile.TemporaryFile()
        self._process = subprocess.Popen(
            self.command, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                problem = self._last_log_line()
                self.__exit__(None, None, None)
                raise AutotuneError(
                    f"llama-server refused {' '.join(self.flags) or 'no flags'}: {problem}"
                )
            if self._healthy():
                return self
            time.sleep(0.2)
        self.__exit__(None, None, None)
        raise AutotuneError(f"llama-server did not start in {START_TIMEOUT_S:.0f} s")

    def __exit__(self, *exc) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=2) as reply:
                return reply.status == 200
        except (OSError, urllib.error.URLError):
            return False

    def decode(self, ids: Sequence[int], max_new_tokens: int) -> Decoded:
        """Greedy decoding of the token ids ``ids``; the seconds are the server's own
        timing of the generated tokens (the prompt's prefill left out)."""
        request = {
            "prompt": list(ids),
            "n_predict": max_new_tokens,
            "temperature": 0.0,  # greedy: the most likely token at every step
            "cache_prompt": False,  # every variant prefills the same way
            "return_tokens": True,
        }
        reply = self._post("/completion", request)
        timings = reply.get("timings", {})
        return Decoded(
            tokens=list(reply.get("tokens", [])),
            seconds=float(timings.get("predicted_ms", 0.0)) / 1e3,
            drafted=int(timings.get("draft_n", 0)),
            accepted=int(timings.get("draft_n_accepted", 0)),
        )

    def _post(self, path: str, body: dict) -> dict:
        data = json.dumps(body).encode()
        request = urllib.request.Request(
            self.url + path, data=data, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as reply:
                return json.loads(reply.read())
        except (OSError, ValueError) as exc:
            raise AutotuneError(f"llama-server failed a request: {exc}") from None

    def _last_log_line(self) -> str:
        self._log.seek(0)
        lines = [x for x in self._log.read().decode(errors="replace").splitlines() if x.strip()]
        errors = [x for x in lines if "error" in x.lower()]
        return (errors or lines or ["it exited without a word"])[-1].strip()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
