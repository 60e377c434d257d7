"""One ``llama-server`` process on a loopback port, and its failures in words.

A server that ends on its own is said in one line: how it ended (the signal, by name, or
its exit code), while doing what (loading the model or serving a request), the likely
cause and what to do, with the tail of its log kept in a file under the cache's
``logs`` folder and named in the line. The last line a server printed before it died is
rarely the reason (a crash prints nothing), so it is only quoted for a refusal (an exit
code), where llama.cpp says why in its own words.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Self

from autotune.errors import AutotuneError
from autotune.files import write_atomic
from autotune.serving import Decoded

START_TIMEOUT_S = 60.0
REQUEST_TIMEOUT_S = 600.0
SLOT_CONTEXT = 4096  # tokens of context each slot of a many-slot server gets
LOG_TAIL_LINES = 200  # of the server's output, kept when it fails
LOADING, SERVING = "loading the model", "serving a request"
REPROVE = "run `autotune engines build llamacpp` to re-prove it"

# Per signal: the likely cause and what to do. A crash while loading is the build's own
# CPU code (on AMX Xeons, weight repacking), which the build's proof retries around.
_SIGNALS = {
    signal.SIGSEGV: ("a crash in its CPU code for this machine", REPROVE),
    signal.SIGBUS: ("the model file changed or shrank while it was mapped", REPROVE),
    signal.SIGILL: ("an instruction this CPU does not have (built for another CPU)", REPROVE),
    signal.SIGABRT: ("llama.cpp stopped itself on a failed check (its log says which)", REPROVE),
    signal.SIGKILL: (
        "killed from outside, most often by the kernel when memory runs out",
        "free memory (or serve fewer slots) and run again",
    ),
    signal.SIGTERM: ("stopped from outside", "run again"),
    signal.SIGINT: ("stopped from outside", "run again"),
}


def _signal_cause(number: int) -> tuple[str, str]:
    """The likely cause of a death by signal ``number``, and what to do."""
    unknown = ("ended by a signal", REPROVE)
    try:
        return _SIGNALS.get(signal.Signals(number), unknown)
    except ValueError:
        return unknown


def exit_text(returncode: int) -> str:
    """How a process ended: ``SIGSEGV (signal 11)`` or ``exit code 1``."""
    if returncode >= 0:
        return f"exit code {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = "an unknown signal"
    return f"{name} (signal {-returncode})"


class ServerDied(AutotuneError):
    """The server ended while loading or serving: by a signal (a crash) or an exit code
    (llama.cpp refused its options or the model)."""

    def __init__(self, line: str, returncode: int, phase: str, log: str):
        super().__init__(line)
        self.returncode = returncode
        self.phase = phase
        self.log = log

    @property
    def crashed(self) -> bool:
        return self.returncode < 0

    @property
    def build_suspect(self) -> bool:
        """Whether the build itself likely crashed (not a kill or stop from outside)."""
        return self.crashed and _signal_cause(-self.returncode)[1] == REPROVE

    def words(self) -> str:
        """``SIGSEGV (signal 11) while loading the model``."""
        return f"{exit_text(self.returncode)} while {self.phase}"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``binary`` serving ``gguf`` with ``parallel`` slots (requests it decodes at once,
    batched), as long as the ``with`` block lasts. ``fixed``: flags this machine's build
    always needs (its proof's record), put before ``flags``, the ones being served."""

    def __init__(
        self,
        binary: Path,
        gguf: Path,
        flags: Sequence[str] = (),
        threads: int = 0,
        parallel: int = 1,
        fixed: Sequence[str] = (),
    ):
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.flags = list(flags)
        # the server splits its context among its slots: each keeps room for a prompt
        context = ("--ctx-size", str(parallel * SLOT_CONTEXT)) if parallel > 1 else ()
        self.command = [
            str(binary),
            *("--model", str(gguf), "--host", "127.0.0.1", "--port", str(port)),
            *("--threads", str(threads or os.cpu_count() or 1), "--parallel", str(parallel)),
            *context,
            *fixed,
            *self.flags,
        ]
        self._process: subprocess.Popen | None = None
        self._log: Any = None

    def __enter__(self) -> Self:
        self._log = tempfile.TemporaryFile()
        self._process = subprocess.Popen(
            self.command, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                died = self._died(LOADING)
                self.__exit__(None, None, None)
                raise died
            if self._healthy():
                return self
            time.sleep(0.2)
        self.__exit__(None, None, None)
        raise AutotuneError(
            f"llama-server did not start in {START_TIMEOUT_S:.0f} s: the machine may be "
            "too busy; run again when it is quieter"
        )

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
        return self.complete(list(ids), max_new_tokens)

    def complete(self, prompt: str | list[int], max_new_tokens: int) -> Decoded:
        """Greedy decoding of ``prompt`` (text, or token ids)."""
        request = {
            "prompt": prompt,
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
            if self._ended():
                raise self._died(SERVING) from None
            raise AutotuneError(
                f"llama-server failed a request: {exc}; run again (a busy machine can "
                "time a request out)"
            ) from None

    def _ended(self) -> bool:
        """Whether the process has ended (a moment allowed: a dropped connection comes
        before the process is gone)."""
        if self._process is None:
            return False
        try:
            self._process.wait(timeout=2)
        except subprocess.TimeoutExpired:
            return False
        return True

    def _died(self, phase: str) -> ServerDied:
        """The process's end in one line, its log's tail kept in a file."""
        assert self._process is not None and self._process.returncode is not None
        code = self._process.returncode
        lines = self._log_lines()
        log = keep_log(self.command, lines)
        if code < 0:
            cause, todo = _signal_cause(-code)
            line = f"llama-server died with {exit_text(code)} while {phase}: {cause}; {todo}"
        else:
            errors = [x for x in lines if "error" in x.lower()]
            said = (errors or lines or ["it exited without a word"])[-1].strip()
            if phase == SERVING:
                what, todo = f"exited while {phase}", REPROVE
            elif self.flags:
                what, todo = f"refused {' '.join(self.flags)}", "correct or drop those flags"
            else:
                what, todo = "refused no flags", "check the model file and this machine's build"
            line = f"llama-server {what} ({exit_text(code)}): {said}; {todo}"
        return ServerDied(f"{line} ({log})", code, phase, log)

    def _log_lines(self) -> list[str]:
        self._log.seek(0)
        text = self._log.read().decode(errors="replace")
        return [x for x in text.splitlines() if x.strip()]


def keep_log(command: Sequence[str], lines: list[str]) -> str:
    """The tail of a failed server's output in a file under the cache's logs: its path,
    or why there is none."""
    from autotune.paths import cache_root

    folder = cache_root() / "logs"
    name = f"llama-server-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{time.monotonic_ns()}"
    path = folder / f"{name}.log"
    text = " ".join(command) + "\n\n" + "\n".join(lines[-LOG_TAIL_LINES:]) + "\n"
    try:
        write_atomic(path, text)
    except AutotuneError:
        return "no log kept: the cache folder is not writable"
    return f"its log: {path}"
