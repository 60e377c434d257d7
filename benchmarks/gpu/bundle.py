"""Prepare, where there is network, what the GPU check needs on a GPU machine without it.

    .venv/bin/python benchmarks/gpu/bundle.py [--model FILE | --no-model]

Downloads (``pip download --no-deps``, one distribution at a time) the wheels of autotune's
dependencies that the GPU machines' image lacks (``image_packages.txt``), and theirs, for
that machine's platform (CPython 3.12, manylinux x86_64), pinned to the versions installed
here where those fit; drops Ray's Java jar (Java workers only; a third of its wheel) and
rewrites the wheel's RECORD to match; then packs the wheels and the embedded model (the
GGUF, cut into parts where it must be) into carries, folders of ``.gpu-bundle/`` that each
fit the device tool's 64 MiB a call beside the working tree. Every carry holds the same
``manifest.json``: each file's size, sha256 and carry, so ``check.py`` on the GPU machine
can stage the carries of several calls and know when it has them all. Prints the sizes
and the calls to make; a file that fits no carry is one line of error (exit 2).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

# what the GPU machine's side reads (stdlib only there): the manifest, hashes, requirements
from check_stage import (  # benchmarks/gpu/ is on sys.path when run as a script
    FORMAT,
    MANIFEST,
    OPTIONAL,
    autotune_requirements,
    extras_text,
    sha256,
)
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
MIB = 2**20
# The device tool carries at most this much a call, the working tree included.
CARRY_LIMIT = 64 * MIB
# Room kept in each carry for the working tree to grow between bundling and the call.
HEADROOM = 2 * MIB
MODEL_PART_MIN = 1 * MIB  # no model part smaller than this: a carry's last scrap stays empty
# The GPU machines' Python (the device notes: python3 is 3.12.3 there, glibc of Ubuntu 24.04).
TARGET_PYTHON = "3.12"
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in range(17, 40)] + [
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
]
# Needed only for what the check never does: PostgreSQL study databases.
# Never carried: the machine's own builds of these must stay as they are.
PROTECTED = re.compile(r"^(torch|torchvision|torchaudio|triton|transformers|nvidia-.*|cuda-.*)$")
# Files a wheel can lose without changing what Python runs (distribution -> path prefix).
SLIM = {"ray": ("ray/jars/", "Java workers only")}


class BundleError(Exception):
    """What stops the bundle, said in one line with what to do."""


def marker_environment(python: str = TARGET_PYTHON) -> dict[str, str]:
    """The GPU machine's values of the environment markers in requirements."""
    return {
        "python_version": python,
        "python_full_version": f"{python}.0",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "os_name": "posix",
        "extra": "",
    }


def image_packages(path: Path = HERE / "image_packages.txt") -> set[str]:
    lines = path.read_text().splitlines()
    return {canonicalize_name(line) for line in lines if line.strip() and line[0] != "#"}


def applies(requirement: Requirement, extras: set[str], python: str = TARGET_PYTHON) -> bool:
    """Whether ``requirement`` (a line of a wheel's Requires-Dist) holds on the GPU machine
    for a distribution asked for with ``extras``."""
    if requirement.marker is None:
        return True
    env = marker_environment(python)
    return any(
        Marker(str(requirement.marker)).evaluate({**env, "extra": extra}) for extra in extras | {""}
    )


@dataclass
class Wheel:
    name: str  # canonical
    version: str
    path: Path
    extras: set[str] = field(default_factory=set)


def local_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def pinned(requirement: Requirement) -> str:
    """The requirement as pip is asked for it: the version installed here when it fits
    (the one autotune is tested with), else the newest that fits."""
    here = local_version(requirement.name)
    if here is not None and requirement.specifier.contains(here, prereleases=True):
        return f"{requirement.name}=={here}"
    return f"{requirement.name}{requirement.specifier}"


def cached_wheel(folder: Path, requirement: Requirement, wanted: str) -> Path | None:
    """A wheel of ``requirement`` already in ``folder`` that ``wanted`` accepts."""
    exact = Requirement(wanted)
    for path in sorted(folder.glob("*.whl")):
        name, version, _, _ = parse_wheel_filename(path.name)
        if name == canonicalize_name(requirement.name) and exact.specifier.contains(
            str(version), prereleases=True
        ):
            return path
    return None


def pip_download(wanted: str, folder: Path, python: str) -> None:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    command += [
        "--python-version",
        python,
        "--implementation",
        "cp",
        "--abi",
        "cp" + python.replace(".", ""),
    ]
    command += [f"--platform={tag}" for tag in PLATFORMS]
    command += ["--disable-pip-version-check", "-q", "-d", str(folder), wanted]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["pip failed"])[-1]
        raise BundleError(
            f"pip download {wanted} for CPython {python} manylinux x86_64 failed ({last}); "
            "check the network and that a wheel of it exists for that platform"
        )


def requires(wheel: Path) -> list[Requirement]:
    """The Requires-Dist lines of a wheel's METADATA."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        text = archive.read(name).decode()
    return [Requirement(line.split(":", 1)[1].strip()) for line in _headers(text, "Requires-Dist")]


def _headers(metadata: str, key: str) -> list[str]:
    head = metadata.split("\n\n", 1)[0]  # the body (the long description) holds no headers
    return [line for line in head.splitlines() if line.startswith(key + ":")]


def resolve(
    wanted: list[Requirement], skip: set[str], folder: Path, python: str = TARGET_PYTHON
) -> dict[str, Wheel]:
    """Every wheel ``wanted`` needs on the GPU machine that is not in ``skip``, downloaded
    into ``folder`` (already there: reused), by reading each wheel's own requirements."""
    folder.mkdir(parents=True, exist_ok=True)
    found: dict[str, Wheel] = {}
    queue = list(wanted)
    while queue:
        requirement = queue.pop(0)
        name = canonicalize_name(requirement.name)
        if name in skip:
            continue
        if PROTECTED.match(name):
            raise BundleError(
                f"{name} would be carried (asked for by a dependency); it must stay the GPU "
                "machine's own build: add it to benchmarks/gpu/image_packages.txt"
            )
        if name in found:
            found[name].extras |= set(requirement.extras)
            continue
        spec = pinned(requirement)
        path = cached_wheel(folder, requirement, spec)
        if path is None:
            pip_download(spec, folder, python)
            path = cached_wheel(folder, requirement, spec)
        if path is None:
            raise BundleError(f"pip saved no wheel for {spec}: look in {folder}")
        version = str(parse_wheel_filename(path.name)[1])
        found[name] = Wheel(name, version, path, set(requirement.extras))
        queue += [r for r in requires(path) if applies(r, set(requirement.extras), python)]
    return found


def slimmed(wheel: Path, drop: str, into: Path) -> Path:
    """A copy of ``wheel`` in ``into`` without the files under ``drop``, its RECORD
    rewritten to list only what it holds (pip checks each file against it)."""
    into.mkdir(parents=True, exist_ok=True)
    target = into / wheel.name
    if target.exists() and target.stat().st_mtime >= wheel.stat().st_mtime:
        return target
    temp = target.with_suffix(".partial")
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(temp, "w") as out:
        for info in source.infolist():
            if info.filename.startswith(drop):
                continue
            data = source.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                data = _record_without(data.decode(), drop).encode()
            out.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
    temp.replace(target)
    return target


def _record_without(record: str, drop: str) -> str:
    lines = [line for line in record.splitlines() if not line.startswith(drop)]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Placed:
    """One file of a carry: a wheel, or bytes [offset, offset + size) of the model."""

    name: str
    size: int
    kind: str  # "wheel" or "model"
    offset: int = 0


def plan_carries(
    wheels: list[tuple[str, int]], model_size: int | None, capacity: int
) -> list[list[Placed]]:
    """Carries of at most ``capacity`` bytes each: the wheels first (largest first, each
    in the first carry with room, so they arrive in the fewest calls), then the model cut
    into parts that fill what room is left, in order, and further carries."""
    carries: list[list[Placed]] = []
    free: list[int] = []
    for name, size in sorted(wheels, key=lambda w: -w[1]):
        if size > capacity:
            raise BundleError(
                f"{name} is {size / MIB:.1f} MiB, more than a carry holds "
                f"({capacity / MIB:.1f} MiB beside the working tree); slim it (bundle.SLIM) "
                "or carry less of the working tree"
            )
        index = next((i for i, room in enumerate(free) if room >= size), len(carries))
        if index == len(carries):
            carries.append([])
            free.append(capacity)
        carries[index].append(Placed(name, size, "wheel"))
        free[index] -= size
    offset, index = 0, 0
    while model_size is not None and offset < model_size:
        if index == len(carries):
            carries.append([])
            free.append(capacity)
        take = min(free[index], model_size - offset)
        if take >= MODEL_PART_MIN or take == model_size - offset:
            part = sum(p.kind == "model" for c in carries for p in c) + 1
            carries[index].append(Placed(f"model.part{part}", take, "model", offset))
            free[index] -= take
            offset += take
        index += 1
    return carries


def travelling_bytes(root: Path = ROOT) -> int:
    """What the device tool sends of the checkout besides the carries: tracked files and
    untracked ones git does not ignore (a ``shared/`` folder there among them)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "-co", "--exclude-standard"],
        cwd=root,
        capture_output=True,
    )
    if listed.returncode != 0:
        raise BundleError(f"git ls-files failed in {root}: run this from a git checkout")
    total = 0
    for name in listed.stdout.decode().split("\0"):
        path = root / name
        if name and path.is_file() and not path.is_symlink():
            total += path.stat().st_size
    return total


def embedded_model() -> Path:
    """The embedded model's GGUF, where autotune itself finds it."""
    sys.path.insert(0, str(ROOT))
    from autotune.errors import AutotuneError
    from autotune.models.registry import EMBEDDED_ALIAS, resolve_model

    try:
        return resolve_model(EMBEDDED_ALIAS).path
    except AutotuneError as e:
        raise BundleError(f"{e} (or pass --no-model)") from None


def write_carries(
    out: Path, plan: list[list[Placed]], wheels: dict[str, Path], model: Path | None
) -> list[Path]:
    """The carry folders (carry1, carry2, ...), each with its files and the manifest."""
    for old in out.glob("carry*"):
        for file in old.iterdir():
            file.unlink()
        old.rmdir()
    folders = []
    for index, placed in enumerate(plan, start=1):
        folder = out / f"carry{index}"
        folder.mkdir(parents=True)
        for item in placed:
            if item.kind == "wheel":
                _link_or_copy(wheels[item.name], folder / item.name)
            else:
                assert model is not None
                with model.open("rb") as source:
                    source.seek(item.offset)
                    (folder / item.name).write_bytes(source.read(item.size))
        folders.append(folder)
    return folders


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        target.write_bytes(source.read_bytes())


def manifest(
    folders: list[Path], model: Path | None, requirements: list[str], notes: dict[str, str]
) -> dict:
    """What every carry says of the whole bundle (its id: a hash of every file's)."""
    files = []
    for index, folder in enumerate(folders, start=1):
        for path in sorted(folder.iterdir()):
            kind = "model" if path.name.startswith("model.part") else "wheel"
            entry = {"name": path.name, "bytes": path.stat().st_size, "kind": kind}
            files.append({**entry, "sha256": sha256(path), "carry": index})
    files.sort(key=lambda f: (f["kind"], _part_number(f["name"]), f["name"]))
    bundle_id = hashlib.sha256("".join(f["sha256"] for f in files).encode()).hexdigest()
    described = None
    if model is not None:
        described = {"name": model.name, "bytes": model.stat().st_size, "sha256": sha256(model)}
    return {
        "format": FORMAT,
        "id": bundle_id[:16],
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": _commit(),
        "python": TARGET_PYTHON,
        "carries": len(folders),
        "requirements": requirements,
        "files": files,
        "model": described,
        "slimmed": notes,
    }


def _part_number(name: str) -> int:
    return int(name.removeprefix("model.part")) if name.startswith("model.part") else 0


def _commit() -> str | None:
    done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return done.stdout.strip() or None


def wanted_requirements(skip: set[str]) -> list[Requirement]:
    """autotune's dependencies that the bundle carries: not the image's, not optional."""
    wanted = []
    for requirement in map(Requirement, autotune_requirements()):
        name = canonicalize_name(requirement.name)
        if name not in skip and name not in OPTIONAL and applies(requirement, set()):
            wanted.append(requirement)
    return wanted


def build(args: argparse.Namespace) -> tuple[list[Path], dict]:
    out: Path = args.out
    skip = image_packages()
    wanted = wanted_requirements(skip)
    wheels = resolve(wanted, skip, out / "downloads", args.python)
    paths, notes = {}, {}
    for name, wheel in wheels.items():
        path = wheel.path
        if name in SLIM:
            drop, why = SLIM[name]
            path = slimmed(wheel.path, drop, out / "slimmed")
            notes[path.name] = (
                f"{drop} dropped ({why}): {wheel.path.stat().st_size / MIB:.1f} -> "
                f"{path.stat().st_size / MIB:.1f} MiB"
            )
        paths[path.name] = path
    model = None if args.no_model else (args.model or embedded_model())
    capacity = args.carry_limit_mib * MIB - travelling_bytes() - args.headroom_mib * MIB
    if capacity < 8 * MIB:
        raise BundleError(
            f"the working tree leaves {capacity / MIB:.1f} MiB of a carry: ignore or remove "
            "large untracked files, then run again"
        )
    sizes = [(name, path.stat().st_size) for name, path in paths.items()]
    plan = plan_carries(sizes, model.stat().st_size if model else None, capacity)
    folders = write_carries(out, plan, paths, model)
    pins = [
        f"{r.name}{extras_text(r)}=={wheels[canonicalize_name(r.name)].version}" for r in wanted
    ]
    described = manifest(folders, model, pins, notes)
    for folder in folders:
        (folder / MANIFEST).write_text(json.dumps(described, indent=1) + "\n")
    return folders, described


def report(folders: list[Path], described: dict, out: Path) -> None:
    print(f"bundle {described['id']} in {out} (CPython {described['python']}, manylinux x86_64)")
    for entry in sorted(described["files"], key=lambda f: (f["carry"], f["kind"] == "model")):
        print(f"  carry{entry['carry']}  {entry['bytes'] / MIB:7.2f} MiB  {entry['name']}")
    for name, note in described["slimmed"].items():
        print(f"  slimmed {name}: {note}")
    tree = travelling_bytes()
    for folder in folders:
        size = sum(p.stat().st_size for p in folder.iterdir())
        print(
            f"{folder.name}: {size / MIB:.1f} MiB + working tree {tree / MIB:.1f} MiB "
            f"= {(size + tree) / MIB:.1f} of {CARRY_LIMIT / MIB:.0f} MiB"
        )
    relative = os.path.relpath(out, ROOT)
    print(
        f"on the GPU machine: {len(folders)} calls, one after the other (it goes back after "
        "30 s idle), each `python3 benchmarks/gpu/check.py` with carry "
        + ", then ".join(f"{relative}/{f.name}" for f in folders)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / ".gpu-bundle")
    parser.add_argument("--model", type=Path, help="model file to carry (default: embedded GGUF)")
    parser.add_argument("--no-model", action="store_true", help="carry wheels only")
    parser.add_argument("--python", default=TARGET_PYTHON, help="the GPU machine's Python")
    parser.add_argument("--carry-limit-mib", type=int, default=CARRY_LIMIT // MIB)
    parser.add_argument("--headroom-mib", type=int, default=HEADROOM // MIB)
    args = parser.parse_args()
    if args.model is not None and not args.model.is_file():
        print(f"error: --model {args.model} is not a file; give the GGUF's path", file=sys.stderr)
        sys.exit(2)
    try:
        folders, described = build(args)
    except BundleError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    report(folders, described, args.out)


if __name__ == "__main__":
    main()
