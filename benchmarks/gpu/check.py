"""The GPU check (issue 40, item 3): one command, run from the repository root on a GPU
machine without network, re-run at every change.

    python3 benchmarks/gpu/check.py [--model-path FILE] [--out DIR]
    .venv/bin/python benchmarks/gpu/check.py --device cpu --quick     # its plumbing, here

It stages the carries of ``bundle.py`` that came with this call (under ``--state``, so the
carries of several calls to one machine add up), lists what autotune needs that this
Python lacks and installs it from the staged wheels offline (never replacing torch,
transformers or a CUDA package), puts the embedded model back together from its parts
(or takes ``--model-path``), then runs each step it has the inputs and the time for, each
in a process of its own with its own time limit:

  environment   card, torch, CUDA, transformers, date, commit
  tests         tests/test_drafter_contract.py and the fixed-shape steps' tests, on the GPU
  latency       autotune latency --model vicuna-13b --random-weights --dtype float16
                --device cuda --roofline --max-tokens 64 -f json
  hf_reference  benchmarks/hf_graph_reference.py on the same shapes (CUDA graphs)
  graph_step    benchmarks/graph_step.py, where the tree has it
  greedy        benchmarks/gpu/greedy_vs_hf.py: the embedded model's plain greedy tokens/s
                in autotune's engine beside transformers' graph-captured decoding
  profile       autotune profile --model smollm2-135m --model-path FILE --device cuda
                --gpus-per-trial 1 --budget ...: its verdict lines
  against_defaults  benchmarks/against_defaults.py on that profile: its tuned setting
                beside its family's published defaults, on its held-back prompts

A step already measured on this machine (in ``--state``) is not run again unless
``--again``. It ends with one table: issue 40's "done when" bars beside the measured values,
pass or fail. Everything measured goes to ``$OUT`` when set (the device tool brings back
what is written there), else to ``--out``: check.json, check.log, summary.txt, profile.yaml.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import check_stage
import check_summary
from check_steps import (
    PROFILE_BUDGET_S,
    ROOT,
    STEPS,
    Context,
    Step,
    json_file,
    step_env,
    step_limit,
)

LOG_TAIL = 400_000  # characters of each stream of a step kept in check.log (16 MiB come back)


# --- running them ------------------------------------------------------------------------


def run_limited(command: list[str], limit: float) -> tuple[subprocess.CompletedProcess, bool]:
    """(the finished process, whether it was stopped at ``limit`` seconds): in a process
    group of its own, so that what it started (Ray's workers) is stopped with it."""
    process = subprocess.Popen(
        command, cwd=ROOT, env=step_env(), text=True, start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    stdout, stderr = "", ""
    try:
        stdout, stderr = process.communicate(timeout=limit)
        return subprocess.CompletedProcess(command, process.returncode, stdout, stderr), False
    except subprocess.TimeoutExpired:
        for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
            try:
                os.killpg(process.pid, sig)
                stdout, stderr = process.communicate(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
            except ProcessLookupError:
                stdout, stderr = process.communicate()
                break
        return subprocess.CompletedProcess(
            command, process.returncode, stdout or "", stderr or ""
        ), True


def skipped(why: str) -> dict:
    return {"status": "skipped", "why": why}


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"


def run_step(ctx: Context, step: Step, log) -> dict:
    """The step's result: status (ok, failed, timeout, skipped), why, seconds, its data."""
    if step.name != "environment" and not ctx.ready:
        return skipped("autotune's requirements are not all installed (see above)")
    if step.needs_model and ctx.model is None:
        return skipped("no model yet: carry the rest of the bundle, or pass --model-path")
    limit = step_limit(ctx, step.name)
    if limit < 10:
        return skipped(f"{ctx.time_left():.0f} s left in this call")
    extra = step.extra(ctx)
    command = step.command(ctx)
    if isinstance(command, str):
        return skipped(command)
    started = time.monotonic()
    done, stopped = run_limited(command, limit)
    seconds = time.monotonic() - started
    log(f"== {step.name} ({seconds:.0f} s, exit {done.returncode}): {' '.join(command)}\n"
            f"{done.stdout[-LOG_TAIL:]}\n{done.stderr[-LOG_TAIL:]}\n")  # fmt: skip
    result = {
        "seconds": round(seconds, 1),
        "returncode": done.returncode,
        "limit_s": round(limit),
        **extra,
    }
    try:
        result["data"] = step.parse(ctx, done)
    except (ValueError, KeyError, IndexError) as e:
        result["why"] = f"its output could not be read ({e})"
    if stopped:
        return {**result, "status": "timeout", "why": f"stopped at its limit of {limit:.0f} s"}
    if done.returncode != 0:
        return {**result, "status": "failed", "why": last_line(done.stderr or done.stdout)}
    return {**result, "status": "ok" if "data" in result else "failed"}


# --- the whole check ---------------------------------------------------------------------


def prepare(args: argparse.Namespace, log) -> tuple[bool, Path | None]:
    """Stage what was carried, install what is missing, find the model: (autotune's
    requirements all installed, the model's path or None)."""
    staged = check_stage.stage(args.bundle, args.state)
    if staged is None:
        print(f"no bundle here ({args.bundle}/carry*) nor staged in {args.state}")
    else:
        files = staged.manifest["files"]
        waiting = staged.carries_missing()
        still = f"; still to carry: {', '.join(f'carry{c}' for c in waiting)}" if waiting else ""
        print(
            f"bundle {staged.manifest['id']}: {len(staged.present)} of {len(files)} staged{still}"
        )
    lacking = check_stage.unmet(
        check_stage.autotune_requirements(), check_stage.installed_versions()
    )
    if lacking and staged is not None and not staged.missing("wheel"):
        print("installing from the bundle, offline: " + ", ".join(u.name for u in lacking))
        check_stage.install(staged, lacking, log)
        lacking = check_stage.unmet(
            check_stage.autotune_requirements(), check_stage.installed_versions()
        )
    for unmet in lacking:
        print(unmet.line())
    return not lacking, find_model(args, staged, ready=not lacking)


def find_model(args: argparse.Namespace, staged, ready: bool) -> Path | None:
    """--model-path; else the model the bundle carried, once all its parts are here; else
    (with autotune's requirements installed) the embedded model where autotune finds it."""
    if args.model_path is not None:
        if not args.model_path.exists():
            raise check_stage.CheckError(
                f"--model-path {args.model_path} does not exist: give the GGUF file or model folder"
            )
        return args.model_path
    model = check_stage.assemble_model(staged) if staged is not None else None
    if model is not None or not ready:
        return model
    sys.path.insert(0, str(ROOT))
    from autotune.errors import AutotuneError
    from autotune.models.registry import EMBEDDED_ALIAS, resolve_model

    try:
        return resolve_model(EMBEDDED_ALIAS).path
    except AutotuneError:
        return None


class Log:
    def __init__(self, path: Path):
        self.path = path
        path.write_text("")

    def __call__(self, text: str) -> None:
        with self.path.open("a") as f:
            f.write(text.rstrip("\n") + "\n")


def output_folder(args: argparse.Namespace) -> Path:
    """$OUT where the device tool sets it (what is written there comes back), else --out."""
    out = Path(os.environ["OUT"]) if os.environ.get("OUT") else args.out
    out.mkdir(parents=True, exist_ok=True)
    return out


def results_file(args: argparse.Namespace) -> Path:
    mode = "quick-" if args.quick else ""
    return args.state / f"results-{mode}{args.device.replace(':', '')}.json"


def report(step: Step, result: dict) -> None:
    seconds = f" in {result['seconds']:.0f} s" if "seconds" in result else ""
    why = f": {result['why']}" if result.get("why") else ""
    print(f"{step.name}: {result['status']}{seconds}{why}", flush=True)
    if step.name == "profile":
        for line in (result.get("data") or {}).get("verdict_lines", []):
            print(f"  {line}")


def write_outputs(out: Path, results: dict, state: Path) -> str:
    table = check_summary.table(results)
    rows = [row.__dict__ for row in check_summary.rows(results)]
    document = {"results": results, "bars": rows, "heading": check_summary.heading(results)}
    (out / "check.json").write_text(json.dumps(document, indent=1) + "\n")
    (out / "summary.txt").write_text(table + "\n")
    if (state / "profile.yaml").is_file():
        shutil.copyfile(state / "profile.yaml", out / "profile.yaml")
    return table


def check(args: argparse.Namespace) -> int:
    started = time.monotonic()
    args.state.mkdir(parents=True, exist_ok=True)
    out = output_folder(args)
    log = Log(out / "check.log")
    ready, model = prepare(args, log)
    saved = results_file(args)
    results = earlier_results(json_file(saved), args)

    def time_left() -> float:
        return args.call_budget - (time.monotonic() - started)

    ctx = Context(args=args, state=args.state, model=model, ready=ready, time_left=time_left)
    for step in STEPS:
        earlier = results.get(step.name, {})
        if step.name in args.skip or earlier.get("status") not in (None, "skipped"):
            continue
        results[step.name] = run_step(ctx, step, log)
        saved.write_text(json.dumps(results, indent=1))
        report(step, results[step.name])
        write_outputs(out, results, args.state)
    print(write_outputs(out, results, args.state))
    print(f"wrote {out}/check.json, summary.txt and check.log")
    return 0


def earlier_results(saved: dict, args: argparse.Namespace) -> dict:
    """What earlier calls on this machine measured and this one keeps: all of it, or with
    ``--again`` the results of the steps it skips (a later call that measures one step
    again still reports the others)."""
    if not args.again:
        return saved
    return {name: result for name, result in saved.items() if name in args.skip}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model-path", type=Path, help="the embedded model's GGUF, or its converted folder"
    )
    parser.add_argument(
        "--device", default="cuda", help="cuda, or cpu with --quick for the plumbing"
    )
    parser.add_argument(
        "--quick", action="store_true", help="small shapes and budgets: prove the plumbing"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=ROOT / "benchmarks/out/gpu-check",
        help="where the results go when $OUT is not set",
    )
    parser.add_argument(
        "--state",
        type=Path,
        default=Path("/tmp/autotune-gpu"),
        help="the stage and the results of earlier calls",
    )
    parser.add_argument(
        "--bundle", type=Path, default=ROOT / ".gpu-bundle", help="the carries' folder"
    )
    parser.add_argument(
        "--call-budget",
        type=float,
        default=540,
        metavar="SECONDS",
        help="start nothing that would end after this",
    )
    parser.add_argument("--profile-budget", type=float, default=PROFILE_BUDGET_S, metavar="SECONDS")
    parser.add_argument("--skip", default="", help="steps to leave out, comma-separated")
    parser.add_argument(
        "--again", action="store_true", help="run the steps measured earlier again (not --skip's)"
    )
    parser.add_argument("--commit", help="the commit measured, where the copy has no git folder")
    args = parser.parse_args(argv)
    args.skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    unknown = args.skip - {s.name for s in STEPS}
    if unknown:
        names = ", ".join(s.name for s in STEPS)
        parser.error(f"--skip {', '.join(sorted(unknown))}: no such step ({names})")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return check(args)
    except check_stage.CheckError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
