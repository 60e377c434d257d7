"""Verdicts on a quiet and on a busy machine: `autotune profile` three times on the same
model and prompts, twice on a quiet machine and once with a CPU hog beside it.

    python benchmarks/noise.py [--methods ngram] [--prompts FILE] [--model smollm2-135m]
                               [--hogs N] [--json] [-- extra profile arguments]

The runs share one study database, so the second and third reuse the first's finished
studies and differ only in what a verdict rests on: the selection and held-back
measurements on the machine as it is then. Prints, and checks:
  - the two quiet runs' intervals overlap (method by method) and recommend the same;
  - the loaded run warns that the machine is busy, records it (environment.noise), and
    recommends nothing that the quiet runs did not.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from autotune.profile.layout import merged

HERE = Path(__file__).resolve().parent


def spin() -> None:  # pragma: no cover - runs in the hog processes
    while True:
        pass


def profile(args: argparse.Namespace, work: Path, label: str, extra: list[str]) -> dict:
    out = work / f"{label}.yaml"
    command = [
        str(Path(sys.executable).parent / "autotune"),
        "profile",
        "--model",
        args.model,
        "--methods",
        args.methods,
        "--prompts",
        args.prompts,
        "--out",
        str(out),
        "--storage",
        f"sqlite:///{work / 'studies.db'}",
        *extra,
    ]
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"{label} run failed:\n{done.stderr[-3000:]}")
    data = merged(yaml.safe_load(out.read_text()))
    methods = {
        name: block["measured"]
        for name, block in data["methods"].items()
        if block and block.get("measured")
    }
    return {
        "recommended": data["recommended"],
        "reason": (data.get("verdict") or {}).get("reason"),
        "busy": data["environment"]["noise"]["busy"],
        "noise": data["environment"]["noise"]["reasons"],
        "warned": "busy" in done.stderr + done.stdout,
        "intervals": {n: m["speedup_interval"] for n, m in methods.items()},
        "speedups": {n: m["speedup"] for n, m in methods.items()},
    }


def overlap(a: list[float], b: list[float]) -> bool:
    return a[0] <= b[1] and b[0] <= a[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--methods", default="ngram")
    parser.add_argument("--prompts", default=str(HERE.parent / "autotune/data/specbench_dev.jsonl"))
    parser.add_argument(
        "--hogs",
        type=int,
        default=os.cpu_count() or 1,
        help="busy-looping processes beside the loaded run",
    )
    parser.add_argument("--json", action="store_true")
    args, extra = parser.parse_known_args()
    extra = [e for e in extra if e != "--"]
    work = Path(tempfile.mkdtemp(prefix="autotune-noise-"))
    runs = {
        "quiet_1": profile(args, work, "quiet_1", extra),
        "quiet_2": profile(args, work, "quiet_2", extra),
    }
    hogs = [multiprocessing.Process(target=spin, daemon=True) for _ in range(args.hogs)]
    for hog in hogs:
        hog.start()
    try:
        runs["loaded"] = profile(args, work, "loaded", extra)
    finally:
        for hog in hogs:
            hog.terminate()
    quiet_1, quiet_2, loaded = runs["quiet_1"], runs["quiet_2"], runs["loaded"]
    checks = {
        "quiet_intervals_overlap": all(
            overlap(quiet_1["intervals"][m], quiet_2["intervals"][m]) for m in quiet_1["intervals"]
        ),
        "quiet_runs_agree": quiet_1["recommended"] == quiet_2["recommended"],
        "loaded_run_warned": loaded["warned"],
        "loaded_run_recorded_noise": loaded["busy"],
        "loaded_run_recommends_nothing_new": loaded["recommended"]
        in ("none", quiet_1["recommended"], quiet_2["recommended"]),
    }
    report = {"runs": runs, "checks": checks, "hogs": args.hogs, "methods": args.methods}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for label, run in runs.items():
            intervals = ", ".join(
                f"{m} {run['speedups'][m]:.3f}x {run['intervals'][m]}" for m in run["intervals"]
            )
            print(
                f"{label:8} recommended {run['recommended']:10} busy {run['busy']!s:5} {intervals}"
            )
            if run["noise"]:
                print(f"         noise: {'; '.join(run['noise'])}")
        for name, ok in checks.items():
            print(f"{'ok  ' if ok else 'FAIL'} {name}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
