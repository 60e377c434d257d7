"""Speculation under load: throughput of plain greedy decoding and of the recommended
method at concurrency 1, 2, 4, 8 in autotune's engine, a per-level schedule chosen on
search prompts, and that schedule against the best single fixed setting on held-back
prompts. Then, unless --skip-llamacpp, the profile's llama.cpp export in llama-server
with as many slots as the highest level, against the same server without speculation, at
each level (as ``autotune verify --engine llamacpp --concurrency`` does, not recorded).
Decoding throughput: prefills are timed apart in autotune's engine, and llama-server's
own per-request decoding times are used there.

    python benchmarks/load.py --profile profile.yaml
    python benchmarks/load.py --profile profile.yaml --levels 1,2 --rounds 3 --max-new-tokens 16

The method is the profile's recommended one (or --method); its candidates are its
setting and smaller ones (``Method.capped``: shorter drafts, smaller trees). On the
search split each level measures every candidate against plain decoding with that many
requests in flight (``measure.load``) and chooses the fastest one clearly above 1.0, or
"off"; the best single fixed setting is the candidate with the highest mean speedup over
the levels. On the held-back split each level then measures the scheduled setting and
the best fixed one against plain decoding, side by side, with 95% intervals over rounds.
Every output is checked against plain greedy decoding of the same prompts.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from _report import machine_line, watch_machine

from autotune.measure.load import (
    LEVELS,
    OFF,
    LevelResult,
    best_fixed,
    crossover,
    in_engine,
    measure_level,
    schedule_of,
)
from autotune.profiling.load import in_turn
from autotune.progress import say, step


def arguments() -> argparse.Namespace:
    default = Path(__file__).resolve().parents[1] / "autotune" / "data" / "specbench_dev.jsonl"
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", required=True, help="the profile whose method is measured")
    parser.add_argument("--method", help="measure this method of the profile instead")
    parser.add_argument("--prompts", default=str(default), help="JSONL workload (split as profile)")
    parser.add_argument("--levels", default=",".join(map(str, LEVELS)))
    parser.add_argument("--rounds", type=int, default=6, help="rounds of prompts per level")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--model-path")
    parser.add_argument("--storage", default="sqlite:///studies/benchmark.db")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--skip-llamacpp", action="store_true", help="no llama-server measurement")
    return parser.parse_args()


def main() -> int:
    from autotune.methods import registry
    from autotune.methods.base import DraftEnv
    from autotune.models.ref import TargetRef
    from autotune.profile.io import read_profile
    from autotune.workspace import Workspace

    args = arguments()
    levels = [int(x) for x in args.levels.split(",")]
    profile = read_profile(Path(args.profile))
    name = args.method or profile.recommended
    if not name or name == "none":
        raise SystemExit(f"{args.profile} recommends no method: give --method")
    settings = getattr(profile.methods, name, None)
    if settings is None:
        raise SystemExit(f"{args.profile} has no {name} method")
    ws = Workspace.open(TargetRef.for_user(args.model, args.model_path), args.prompts, args.storage)
    method = registry.get(name)
    env = DraftEnv(ws.ref, ws.runner)
    variants = {label: s for label, (_, s) in method.load_settings(settings).items()}
    candidates = {label: method.variant(s, env).make for label, s in variants.items()}
    search = in_turn(ws.encode(ws.search_prompts()))
    heldback = in_turn(ws.encode(ws.heldback_prompts()))
    started = time.monotonic()
    run_round = in_engine(ws.runner, args.max_new_tokens, candidates)

    def level_of(split: str, prompts: list[list[int]], level: int, names: list[str]):
        label = f"{split} split, concurrency {level}: plain, {', '.join(names)}"
        with step(label, args.rounds) as advance:
            return measure_level(
                run_round, names, prompts, level, args.rounds, on_round=lambda _: advance()
            )

    watch_machine(ws.runner)
    chosen_on: list[LevelResult] = [
        level_of("search", search, level, list(candidates)) for level in levels
    ]
    schedule = schedule_of(chosen_on)
    fixed = best_fixed(chosen_on)
    watch_machine(ws.runner)

    measured: list[LevelResult] = []
    for level in levels:
        names = {n for n in (schedule[level], fixed) if n is not None and n != OFF}
        measured.append(level_of("held-back", heldback, level, sorted(names)))
    watch_machine(ws.runner)
    report = summary(name, variants, chosen_on, measured, schedule, fixed, args)
    if not args.skip_llamacpp:
        report["llamacpp"] = in_llamacpp(args, levels)
        watch_machine(ws.runner)
    report["seconds"] = round(time.monotonic() - started, 1)
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print_table(report)
    say(machine_line())
    return 0


def in_llamacpp(args, levels: list[int]) -> dict | None:
    """The profile's llama.cpp export in llama-server with as many slots as the highest
    level, against the same server without speculation (``autotune verify
    --concurrency``), on the held-back prompts; None where llama-server is not built."""
    from autotune.serving import llamacpp
    from autotune.verify import verify_load

    if not llamacpp.built():
        say("llama-server is not built (autotune engines build llamacpp): llama.cpp skipped")
        return None
    load = verify_load(
        Path(args.profile),
        tuple(levels),
        args.rounds,
        max_new_tokens=args.max_new_tokens,
        record=False,
    )
    return load.model_dump()


def described(settings) -> str:
    """One line per setting where the method has one (n-gram), else its fields."""
    if hasattr(settings, "config"):
        from autotune.methods.ngram.settings import describe

        return describe(settings.config())
    return str(settings.model_dump(exclude_none=True))[:100]


def summary(name, variants, chosen_on, measured, schedule, fixed, args) -> dict:
    rows = []
    for search_level, level in zip(chosen_on, measured):
        concurrency = level.concurrency
        row = {
            "concurrency": concurrency,
            "rounds": level.rounds,
            "scheduled": schedule[concurrency],
            "search": {
                n: {"speedup": round(f.speedup, 3), "interval": f.interval.as_list()}
                for n, f in search_level.figures.items()
            },
        }
        plain = next(iter(level.figures.values()), None)
        if plain is not None:
            row["plain_tokens_per_s"] = round(plain.plain_tokens_per_s, 1)
            row["plain_latency_s"] = round(plain.plain_latency_s, 2)
        for role, n in (("schedule", schedule[concurrency]), ("best_fixed", fixed)):
            if n is None:
                continue
            if n == OFF:
                row[role] = {"setting": OFF, "speedup": 1.0, "interval": [1.0, 1.0]}
                continue
            f = level.figures[n]
            row[role] = {
                "setting": n,
                "speedup": round(f.speedup, 3),
                "interval": f.interval.as_list(),
                "tokens_per_s": round(f.tokens_per_s, 1),
                "latency_s": round(f.latency_s, 2),
                "lossless": f.lossless,
            }
        rows.append(row)
    ratios = [
        r["schedule"]["speedup"] / r["best_fixed"]["speedup"]
        for r in rows
        if "schedule" in r and "best_fixed" in r
    ]
    return {
        "method": name,
        "settings": {label: described(s) for label, s in variants.items()},
        "max_new_tokens": args.max_new_tokens,
        "levels": rows,
        "crossover": crossover(schedule),
        "best_fixed": fixed,
        "schedule_vs_best_fixed_mean": round(sum(ratios) / len(ratios), 3) if ratios else None,
        "schedule_min_vs_off": min((r["schedule"]["speedup"] for r in rows), default=None),
        "lossless": all(
            r[role].get("lossless", True)
            for r in rows
            for role in ("schedule", "best_fixed")
            if role in r
        ),
    }


def print_table(report: dict) -> None:
    print(f"method: {report['method']}  ({report['max_new_tokens']} new tokens a request)")
    for label, text in report["settings"].items():
        print(f"  {label:14s} {text}")
    print(f"{'conc':>4}  {'plain tok/s':>11}  {'scheduled':28s}  {'best fixed':28s}  sched/fixed")
    for row in report["levels"]:
        cells = []
        for role in ("schedule", "best_fixed"):
            figure = row.get(role)
            if figure is None:
                cells.append("-")
                continue
            low, high = figure["interval"]
            cells.append(f"{figure['setting']} {figure['speedup']:.3f}x [{low:.3f}, {high:.3f}]")
        ratio = (
            row["schedule"]["speedup"] / row["best_fixed"]["speedup"]
            if "schedule" in row and "best_fixed" in row
            else float("nan")
        )
        print(
            f"{row['concurrency']:>4}  {row.get('plain_tokens_per_s', 0):>11.1f}  "
            f"{cells[0]:28s}  {cells[1]:28s}  {ratio:.3f}"
        )
    crossing = report["crossover"]
    print(
        "crossover: "
        + (f"speculation off from concurrency {crossing}" if crossing else "none measured")
    )
    engine = report.get("llamacpp")
    if engine:
        print(f"llama.cpp {engine['release']} ({engine['setting']}), {engine['parallel']} slots:")
        for level in engine["levels"]:
            low, high = level["speedup_interval"]
            print(
                f"{level['concurrency']:>4}  {level['baseline_tokens_per_s']:>11.1f}  "
                f"export {level['speedup']:.3f}x [{low:.3f}, {high:.3f}]  lossless "
                f"{level['lossless']}"
            )
        crossing = engine["crossover"]
        print(
            "llama.cpp crossover: "
            + (f"no faster from concurrency {crossing}" if crossing else "none measured")
        )
    print(
        f"best single fixed setting: {report['best_fixed']}; schedule / best fixed, mean over "
        f"levels: {report['schedule_vs_best_fixed_mean']}; schedule's lowest speedup: "
        f"{report['schedule_min_vs_off']}; lossless: {report['lossless']}"
    )


if __name__ == "__main__":
    sys.exit(main())
