"""The GPU check's first half, in the standard library alone (it runs before anything is
installed): stage the carries of ``bundle.py`` that have arrived, list what autotune
needs that this Python lacks, install it from the staged wheels without the network,
and put the embedded model back together from its parts.

The stage lives outside the working tree (``/tmp/autotune-gpu`` unless told), so the
carries of several calls to one warm machine add up there."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FORMAT = "autotune-gpu-bundle/1"
MANIFEST = "manifest.json"
# Needed only for what the check never does: neither bundled nor installed.
OPTIONAL = {"psycopg": "PostgreSQL study databases only; the check uses SQLite"}
# The machine's own builds, never to be replaced by an install from the bundle.
PROTECTED = re.compile(
    r"^(torch|torchvision|torchaudio|triton|transformers|numpy|nvidia-.*|cuda-.*|cupy-.*|jax.*)$"
)


class CheckError(Exception):
    """What stops the check, said in one line with what to do."""


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Unmet:
    name: str
    wanted: str  # the requirement as written
    found: str | None  # the version installed, None when absent

    def line(self) -> str:
        if self.found is None:
            return f"missing: {self.wanted}"
        return f"wrong version: {self.name} {self.found} installed, {self.wanted} needed"


def installed_versions() -> dict[str, str]:
    """This Python's distributions: canonical name -> version."""
    from importlib.metadata import distributions

    return {canonical(d.metadata["Name"] or ""): d.version for d in distributions()}


def extra_requirements(name: str, extras: set[str]) -> list[str]:
    """What the installed distribution ``name`` asks for with ``extras`` (Requires-Dist
    lines whose marker names one of them), e.g. ray[tune]'s pandas and tensorboardX."""
    from importlib.metadata import PackageNotFoundError, requires

    try:
        lines = requires(name) or []
    except PackageNotFoundError:
        return []
    wanted = []
    for line in lines:
        if ";" not in line:
            continue
        marker = line.split(";", 1)[1]
        if any(re.search(rf"extra\s*==\s*['\"]{e}['\"]", marker) for e in extras):
            wanted.append(line)
    return wanted


def unmet(requirements: list[str], installed: Mapping[str, str], extras=extra_requirements):
    """The requirements (pyproject's lines) that ``installed`` does not satisfy, those of
    their extras included; optional ones (``OPTIONAL``) are not listed."""
    return _unmet(requirements, installed, extras, set())


def _unmet(requirements, installed, extras, asked: set[str]) -> list[Unmet]:
    found: list[Unmet] = []
    for text in requirements:
        requirement = _parsed(text, asked)
        if requirement is None or canonical(requirement.name) in OPTIONAL:
            continue
        name = canonical(requirement.name)
        wanted = f"{requirement.name}{extras_text(requirement)}{requirement.specifier}"
        version = installed.get(name)
        if version is None:
            found.append(Unmet(name, wanted, None))
            continue
        if not requirement.specifier.contains(version, prereleases=True):
            found.append(Unmet(name, wanted, version))
        if requirement.extras:
            more = extras(name, set(requirement.extras))
            found += _unmet(more, installed, extras, set(requirement.extras))
    return found


def extras_text(requirement) -> str:
    """A requirement's extras as pip spells them after its name ("[a,b]"; "" for none)."""
    return f"[{','.join(sorted(requirement.extras))}]" if requirement.extras else ""


def _parsed(text: str, asked: set[str]):
    """The requirement, or None where its marker holds on this machine for none of the
    extras ``asked`` for. Without `packaging` (pip vendors its own), the vendored one."""
    try:
        from packaging.requirements import Requirement
    except ImportError:
        from pip._vendor.packaging.requirements import Requirement  # type: ignore
    requirement = Requirement(text)
    marker = requirement.marker
    if marker is not None and not any(marker.evaluate({"extra": e}) for e in asked | {""}):
        return None
    return requirement


def autotune_requirements(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """autotune's own dependencies, as pyproject.toml states them."""
    return list(tomllib.loads(pyproject.read_text())["project"]["dependencies"])


# --- the stage ---------------------------------------------------------------------------


@dataclass
class Stage:
    """The bundle staged so far: its manifest and the files verified in ``folder``."""

    folder: Path
    manifest: dict
    present: set[str]

    def missing(self, kind: str) -> list[dict]:
        return [f for f in self.manifest["files"] if f["kind"] == kind and f["name"] not in self]

    def __contains__(self, name: str) -> bool:
        return name in self.present

    def carries_missing(self) -> list[int]:
        return sorted({f["carry"] for f in self.manifest["files"] if f["name"] not in self})

    @property
    def wheels(self) -> Path:
        return self.folder / "files"


def read_manifest(path: Path) -> dict:
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CheckError(
            f"cannot read {path} ({e}); make the bundle again with bundle.py"
        ) from None
    if manifest.get("format") != FORMAT:
        raise CheckError(f"{path} is not a bundle of this check ({FORMAT}); run bundle.py again")
    return manifest


def stage(bundle: Path, state: Path) -> Stage | None:
    """Copy every verified file of the carries in ``bundle`` into the stage of their
    bundle under ``state``; None when no carry and no stage is there."""
    carried = sorted(bundle.glob(f"carry*/{MANIFEST}"))
    manifests = [read_manifest(path) for path in carried]
    if not manifests:
        staged = sorted(state.glob(f"bundle-*/{MANIFEST}"))
        if not staged:
            return None
        manifests, carried = [read_manifest(staged[-1])], []
    ids = {m["id"] for m in manifests}
    if len(ids) > 1:
        raise CheckError(
            f"the carries come from {len(ids)} different bundles ({', '.join(sorted(ids))}): "
            "carry the folders of one bundle.py run"
        )
    manifest = manifests[0]
    folder = state / f"bundle-{manifest['id']}"
    (folder / "files").mkdir(parents=True, exist_ok=True)
    (folder / MANIFEST).write_text(json.dumps(manifest))
    for path in carried:
        _take(path.parent, folder / "files", manifest)
    present = {f["name"] for f in manifest["files"] if _verified(folder / "files", f)}
    return Stage(folder, manifest, present)


def _take(carry: Path, files: Path, manifest: dict) -> None:
    for entry in manifest["files"]:
        source, target = carry / entry["name"], files / entry["name"]
        if source.is_file() and not _verified(files, entry):
            temp = target.with_name(target.name + ".partial")
            shutil.copyfile(source, temp)
            if sha256(temp) != entry["sha256"]:
                temp.unlink()
                raise CheckError(f"{source} is damaged (its sha256 differs): carry it again")
            temp.replace(target)
            (files / (entry["name"] + ".ok")).write_text(entry["sha256"])


def _verified(files: Path, entry: dict) -> bool:
    mark = files / (entry["name"] + ".ok")
    return mark.is_file() and mark.read_text() == entry["sha256"]


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def assemble_model(staged: Stage) -> Path | None:
    """The model put back together from its parts (checked whole), once every part is
    staged; None while one is missing or the bundle carries no model."""
    model = staged.manifest.get("model")
    if model is None or staged.missing("model"):
        return None
    target = staged.folder / "model" / model["name"]
    mark = target.with_name(target.name + ".ok")
    if target.is_file() and mark.is_file() and mark.read_text() == model["sha256"]:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    parts = [f for f in staged.manifest["files"] if f["kind"] == "model"]
    temp = target.with_name(target.name + ".partial")
    with temp.open("wb") as out:
        for part in sorted(parts, key=lambda p: int(p["name"].removeprefix("model.part"))):
            with (staged.wheels / part["name"]).open("rb") as source:
                shutil.copyfileobj(source, out)
    if sha256(temp) != model["sha256"]:
        temp.unlink()
        raise CheckError("the model put together from its parts is damaged: carry them again")
    temp.replace(target)
    mark.write_text(model["sha256"])
    return target


# --- installing --------------------------------------------------------------------------


def protected_pins(installed: Mapping[str, str]) -> list[str]:
    """Constraints that hold the machine's own torch, transformers and CUDA packages at
    the versions it has: pip may add packages, never replace these."""
    return [
        f"{name}=={version}" for name, version in sorted(installed.items()) if PROTECTED.match(name)
    ]


def install_command(staged: Stage, wanted: list[Unmet], constraints: Path) -> list[str]:
    """pip, offline, from the staged wheels only, the bundle's pinned versions of what is
    missing; never an upgrade of what the machine has (constraints), no cache."""
    pins = {
        canonical(re.split(r"[\[=<>!~ ]", p, maxsplit=1)[0]): p
        for p in staged.manifest["requirements"]
    }
    names = [pins.get(u.name, u.wanted) for u in wanted]
    offline = ["--no-index", "--find-links", str(staged.wheels), "-c", str(constraints)]
    quiet = ["--no-cache-dir", "--no-compile", "--disable-pip-version-check"]
    return [sys.executable, "-m", "pip", "install", *offline, *quiet, *names]


def install(staged: Stage, wanted: list[Unmet], log) -> None:
    """Install ``wanted`` from the stage; a failure is one line naming pip's last word."""
    constraints = staged.folder / "constraints.txt"
    constraints.write_text("\n".join(protected_pins(installed_versions())) + "\n")
    command = install_command(staged, wanted, constraints)
    done = subprocess.run(command, capture_output=True, text=True)
    log(" ".join(command) + "\n" + done.stdout + done.stderr)
    if done.returncode != 0:
        last = [line for line in done.stderr.splitlines() if line.strip()][-1:] or ["no output"]
        raise CheckError(
            f"pip could not install {', '.join(u.name for u in wanted)} from the bundle "
            f"({last[0].strip()[:200]}); see the log, and make the bundle again with bundle.py"
        )
