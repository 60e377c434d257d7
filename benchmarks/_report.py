"""What the benchmark scripts share: the measuring arguments, the workspace they search in,
and the output (JSON, or one line per variant)."""

from __future__ import annotations

import argparse
import json

from autotune.measure.noise import NoiseRecord, probe
from autotune.progress import say

# What the machine did while this script measured: probed before and after each
# measurement, and said with the figures (a busy machine's ratios are not to be trusted).
MACHINE = NoiseRecord()


def watch_machine(runner) -> None:
    MACHINE.during.append(probe(runner))


def machine_line(record: NoiseRecord | dict = MACHINE) -> str:
    """One line on the load: quiet, or busy and why, and how far its speed drifted."""
    noise = record.as_dict() if isinstance(record, NoiseRecord) else record
    if not noise.get("forward_ms_range"):
        return "machine: not probed"
    low, high = noise["forward_ms_range"]
    speed = f"one forward {low:.0f}-{high:.0f} ms"
    if noise["busy"]:
        return (
            f"machine: BUSY while measuring ({'; '.join(noise['reasons'])}; {speed}): these "
            "figures are not to be trusted, run again on a quiet machine"
        )
    return f"machine: quiet while measuring ({speed})"


def measuring_arguments(parser: argparse.ArgumentParser) -> None:
    """--prompts (where variants are measured, never searched on), --max-new-tokens,
    --json, --model, --model-path, --storage, --limit."""
    parser.add_argument("--prompts", required=True, help="JSONL prompts to measure on")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--model-path")
    parser.add_argument("--storage", default="sqlite:///studies/benchmark.db")
    parser.add_argument("--limit", type=int, default=None, help="measure on the first N prompts")


def open_workspace(args: argparse.Namespace):
    """The workspace over the packaged calibration prompts (what searches use), and the
    encoded --prompts (what variants are measured on)."""
    from autotune.models.ref import TargetRef
    from autotune.prompts import default_prompts_path, load_prompts
    from autotune.workspace import Workspace

    ws = Workspace.open(
        TargetRef.for_user(args.model, args.model_path), default_prompts_path(), args.storage
    )
    return ws, ws.encode(load_prompts(args.prompts)[: args.limit])


def tune(ws, method: str, heads: str | None = None, trials: int | None = None):
    """``method``'s setting as `autotune profile` chooses it (search split only)."""
    from autotune.profiling.request import ProfileRequest
    from autotune.profiling.setup import make_setup
    from autotune.profiling.tune import tune_methods, tuning_schedule

    request = ProfileRequest(
        model=ws.ref.spec, methods=(method,), trials=trials, heads={method: heads} if heads else {}
    )
    setup = make_setup(request)
    return tune_methods(setup, ws, request, tuning_schedule(setup))[method]


def measure(ws, makers: dict, prompts, max_new_tokens: int, until=None) -> dict:
    """Every variant against one plain greedy decoding per prompt, interleaved (``until``:
    a ``Budget`` past which no prompt is started, but the first two)."""
    from autotune.measure.timing import measure_variants
    from autotune.progress import step

    watch_machine(ws.runner)
    with step(
        "measure the variants, interleaved prompt by prompt", len(prompts) * len(makers)
    ) as advance:
        measured = measure_variants(
            ws.runner, makers, prompts, max_new_tokens, on_prompt=lambda _: advance(), until=until
        )
    watch_machine(ws.runner)
    return measured


def paired_ratio(one, other):
    """``one``'s throughput over ``other``'s (two ``Measurement``s of one side by side, on
    the same prompts), and its 95% interval from a paired bootstrap over prompts: a
    prompt's two decodings are drawn together, so what the prompt costs cancels."""
    from autotune.measure.stats import Pairs, bootstrap_interval

    pairs = Pairs.of(
        (mine.method_seconds, mine.method_tokens, theirs.method_seconds, theirs.method_tokens)
        for mine, theirs in zip(one.prompts, other.prompts, strict=True)
    )
    return pairs.speedup(), bootstrap_interval(pairs)


def tuned_ratios(results: dict, others) -> dict:
    """Speedup of ``tuned`` over each of ``others``."""
    tuned = results["tuned"]["speedup"]
    return {f"tuned_vs_{k}": round(tuned / results[k]["speedup"], 4) for k in others}


def print_report(report: dict, as_json: bool, extra: str = "") -> None:
    """``extra``: a format string over a variant's row, appended to its line. Every speedup
    is printed with its 95% interval (paired bootstrap over prompts), and per category when
    the prompts carry categories."""
    from autotune.measure.timing import interval_text

    if MACHINE.during:
        report.setdefault("machine", MACHINE.as_dict())
    if as_json:
        print(json.dumps(report, indent=2))
        return
    if "machine" in report:
        say(machine_line(report["machine"]))
    for name, row in report["variants"].items():
        say(
            f"{name:15} {interval_text(row):24} {row['tokens_per_step']:.2f} tokens/step  "
            + (extra.format(**row) + "  " if extra else "")
            + f"lossless {row['lossless']}  ({row['prompts']} prompts)"
        )
        for category, part in (row.get("by_category") or {}).items():
            say(f"    {category:15} {interval_text(part):24} {part['prompts']} prompts")
    say(json.dumps(report["ratios"]))
