"""Time README command 1 (`autotune profile --model smollm2-135m`, every method, heads
trained as needed) and print the time of each phase, the heads' accuracy and each
method's held-back speedup with its interval. Then, on the held-back prompts the profile
measured on, every method's section of the profile and the published defaults of the
recommended method side by side against plain greedy (one process, interleaved): is the
recommended method the fastest there, and how much faster than its published defaults?

    .venv/bin/python benchmarks/end_to_end.py              # the README command, as is
    .venv/bin/python benchmarks/end_to_end.py --budget 10m  # extra flags go to profile
    .venv/bin/python benchmarks/end_to_end.py --fresh       # README command 1 as a new
                                                            # user runs it: see below
    .venv/bin/python benchmarks/end_to_end.py --fresh --command-only --record "NOTE"

``--command-only`` skips the side by side after the profile. ``--record NOTE`` appends the
run to the end-to-end table of ``benchmarks/results.yaml`` (NOTE: what the run was) and
rewrites the docs' tables (``benchmarks/tables.py``).

``--fresh`` clones the repository's HEAD into a temporary folder and times its set-up
(``scripts/setup.sh``) and the profile with an empty cache (the model converted, the
engine's kernel built, heads trained): the whole of README command 1 on a fresh clone.

A benchmark, not a test: the figure depends on the machine. Run it on a quiet one.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _report import machine_line
from tables import record

PHASE = re.compile(r"^\[(\d+)/(\d+)\] (.+?) \(~")


def main(argv: list[str]) -> int:
    fresh = "--fresh" in argv
    command_only = "--command-only" in argv
    note = argv[argv.index("--record") + 1] if "--record" in argv else None
    extra = [a for a in argv if a not in ("--fresh", "--command-only", "--record", note)]
    autotune = Path(sys.executable).parent / "autotune"
    work = Path(tempfile.mkdtemp(prefix="autotune-e2e-"))
    env = dict(os.environ)
    setup_s = 0.0
    if fresh:
        env["AUTOTUNE_CACHE"] = str(work / "cache")
        # the engine's kernel is built for this CPU once per machine: a fresh run builds it
        env["TORCH_EXTENSIONS_DIR"] = str(work / "torch_extensions")
        setup_s, autotune = _set_up_clone(work / "clone", env)
    out = work / "profile.yaml"
    command = [str(autotune), "profile", "--model", "smollm2-135m", "--out", str(out), *extra]
    print("running:", " ".join(command[1:]), f"(in {work})", flush=True)
    started = time.monotonic()
    marks: list[tuple[str, float]] = [("start-up, loading, noise check", started)]
    process = subprocess.Popen(
        command, cwd=work, env=env, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert process.stderr is not None and process.stdout is not None
    for line in process.stderr:  # echoed with the time since start, to see each step's cost
        sys.stderr.write(f"{_clock(time.monotonic() - started)} {line}")
        found = PHASE.match(line.strip())
        if found:
            marks.append((found.group(3), time.monotonic()))
    stdout = process.stdout.read()
    code = process.wait()
    ended = time.monotonic()
    print(stdout)
    print("time per phase (m:s):")
    for (name, at), (_, until) in zip(marks, marks[1:] + [("end", ended)]):
        print(f"  {name:<40} {_clock(until - at):>7}")
    print(f"  {'whole command':<40} {_clock(ended - started):>7}  (exit {code})")
    if fresh:
        print(f"  {'set-up (scripts/setup.sh)':<40} {_clock(setup_s):>7}")
        print(f"  {'README command 1, set-up included':<40} {_clock(setup_s + ended - started):>7}")
    if code != 0:
        return code
    whole = _clock(setup_s + ended - started) + (f" (set-up {_clock(setup_s)})" if fresh else "")
    profile = _figures(out, env)
    ratio = "not measured (the command alone)" if command_only else _against_defaults(profile, out)
    if note is not None:
        record("end-to-end", _row(profile, note, whole, ratio))
        print("recorded in benchmarks/results.yaml and the docs' tables")
    return code


def _row(profile, note: str, whole: str, ratio: str) -> dict:
    """The run as a row of the end-to-end table."""
    measured = []
    for name, block in profile.method_blocks().items():
        m = block.measured
        if m is not None:
            low, high = m.speedup_interval or (m.speedup, m.speedup)
            mark = " (recommended)" if name == profile.recommended else ""
            measured.append(f"{name} {m.speedup:.2f}x [{low:.2f}, {high:.2f}] on {m.prompts}{mark}")
    noise = profile.environment.noise if profile.environment is not None else {}
    return {
        "date": time.strftime("%Y-%m-%d"),
        "run": f"{note} ({machine_line(noise).removeprefix('machine: ')})",
        "whole": whole,
        "n-gram study: whole / pruned trials": "",
        "held back (MT-bench)": "; ".join(measured) or f"recommended: {profile.recommended}",
        "tuned / best default": ratio,
    }


def _set_up_clone(folder: Path, env: dict) -> tuple[float, Path]:
    """A clone of this repository's HEAD set up as README command 1 sets one up: the
    seconds it took and the clone's ``autotune``."""
    root = Path(__file__).resolve().parent.parent
    subprocess.run(["git", "clone", "--quiet", str(root), str(folder)], check=True)
    # a new user's shell: this repository's virtual environment neither active nor on PATH
    clean = {k: v for k, v in env.items() if k != "VIRTUAL_ENV"}
    ours = str(Path(sys.executable).parent)
    clean["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != ours)
    print(f"set-up: bash scripts/setup.sh (in {folder})", flush=True)
    started = time.monotonic()
    subprocess.run(["bash", "scripts/setup.sh"], cwd=folder, env=clean, check=True)
    return time.monotonic() - started, folder / ".venv" / "bin" / "autotune"


def _figures(path: Path, env: dict):
    """The profile's figures printed; the profile."""
    import json

    from autotune.profile.io import read_profile

    profile = read_profile(path)
    os.environ.update(env)  # the cache the command used
    from autotune.training.job import cached_heads_folder

    for kind in ("medusa", "eagle", "glide"):
        config = cached_heads_folder(profile.model.fingerprint, kind) / "config.json"
        if config.is_file():
            record = json.loads(config.read_text())["autotune"]
            top1 = [round(row["top1"], 3) for row in record["accuracy_held_back"]]
            print(
                f"{kind} heads: held-back top-1 {top1} after {record['training']['epochs']} "
                f"epochs on {record['tokens']['train']} answer tokens"
            )
    for name, block in profile.method_blocks().items():
        m = block.measured
        if m is None:
            continue
        low, high = m.speedup_interval or (m.speedup, m.speedup)
        print(
            f"{name:<10} {m.speedup:.3f}x [{low:.3f}, {high:.3f}] on {m.prompts} held-back "
            f"prompts, {m.tokens_per_step:.2f} tokens/step, lossless {m.lossless}"
        )
    print(f"recommended: {profile.recommended}")
    if profile.environment is not None:
        print(f"during the profile, {machine_line(profile.environment.noise)}")
    verdict = profile.verdict
    if verdict is not None:
        from autotune.profiling.report import time_lines

        print("\n".join(time_lines(verdict.time)))
        for name, why in verdict.skipped.items():
            print(f"{name} skipped: {why}")
        for name, why in verdict.dropped.items():
            print(f"{name} dropped from the selection race: {why}")
    return profile


def _against_defaults(profile, path: Path) -> str:
    """Every method's section and the recommended method's published defaults, on the
    held-back prompts the profile measured, side by side against plain greedy
    (``against_defaults.py``); the tuned setting over the best default, for the table."""
    import against_defaults as side_by_side

    if side_by_side.measured_count(profile) is None:
        return "not measured (no method measured held back)"
    # the race's dropped methods too: were they rightly dropped?
    result = side_by_side.against_defaults(path, side_by_side.Options(every_method=True))
    print("\n" + "\n".join(side_by_side.variant_lines(result)))
    methods = {
        name: row
        for name, row in result["variants"].items()
        if not name.startswith(side_by_side.DEFAULT)
    }
    fastest = max(methods, key=lambda name: methods[name]["speedup"])
    print(f"fastest method of the profile here: {fastest}")
    print(side_by_side.ratio_line(result))
    ratio = result["ratio"]
    if ratio is None:
        return "not measured (no published default of the recommended method)"
    return f"{ratio['value']:.2f}x ({ratio['best_default']})"


def _clock(seconds: float) -> str:
    seconds = round(seconds)
    return f"{seconds // 60}:{seconds % 60:02d}"


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
