"""What the engine's fixed-shape step saves (issue 40): one forward over n new tokens after
a 160-token context, eagerly, as the fixed-shape step run eagerly, recorded as CUDA
graphs (also with each of the layers' fused forms turned off in turn, at 1 and 64 tokens:
the norm, the rotation, the residual sum and the fused products of q/k/v and gate/up),
and under torch.compile(mode="reduce-overhead"), each as a ratio to eager:

    python benchmarks/graph_step.py --model vicuna-13b --random-weights --dtype float16 \\
        --device cuda [--repeats 7] [--json] [--kernels] [--time-limit S] [--out FILE]

Medians over ``--repeats`` rounds after a warm-up round (where the graphs are recorded and
compiled), every size timed in each round, CUDA synchronised around each forward
(``measure.costs``). The runners are timed one after another in one process. On a CPU
the graph and compile columns say "cuda only". torch.compile compiles each size anew (as
``dynamic=False`` asks), so its column times the two ends, 1 and 64 tokens.
``--kernels`` adds the step's kernels by name at 1 and 64 tokens (``step_kernels``), to
tell what grows with the verify size; they are listed first. ``--time-limit``: no part
starts after that many seconds (the rest say so); ``--out``: the JSON is also written
there after every part, so that a run stopped from outside keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

SIZES = (1, 2, 4, 8, 16, 32, 64)
# column -> (Runner's static and how, a fused form turned off); how None: the runner's
# eager layers, the yardstick. The "plain" columns record the step as graphs with one of
# the layers' fused forms (``layers.FUSION_RULES``) turned off: each was chosen by counting
# a step's operations on a CPU, and these say whether it pays on this GPU at 1 and 64 rows
WAYS: dict[str, tuple[str | None, str | None]] = {
    "eager": (None, None),
    "static-eager": ("eager", None),
    "cuda-graph": ("graph", None),
    "graph, plain norm": ("graph", "fused_norm_applies"),
    "graph, plain rotation": ("graph", "fused_rotation_applies"),
    "graph, plain residual": ("graph", "fused_residual_applies"),
    "graph, plain products": ("graph", "fused_products_applies"),
    "compile": ("compile", None),
}
CUDA_ONLY = ("graph", "compile")
# the sizes a way times (the others: every size): each size is a compile of its own, of
# a 40-layer graph for a 13B step (not yet timed on a GPU; expected to take tens of
# seconds), and the check gives this script 90 s in all; the plain forms' columns are
# there to compare with cuda-graph's at the two ends
ENDS = (1, max(SIZES))
SIZES_OF = {"compile": ENDS, **{way: ENDS for way, (_, off) in WAYS.items() if off}}
WIDTH = 24  # a column's characters in the table
# kernel names listed per size by --kernels: a decoder step runs a few dozen distinct ones,
# so the sizes' lists can be compared name by name
KERNELS_LISTED = 40


def load_model(args: argparse.Namespace):
    """(model, name) on the asked device and dtype, as `autotune latency` loads them."""
    from autotune.measure.costs import CONTEXT_TOKENS
    from autotune.models import load_target, random_weights_model
    from autotune.models.loading import placement

    dtype, device = placement(args.dtype, args.device)
    tokens = 2 * CONTEXT_TOKENS  # what the timing cache holds (``measure.costs``)
    if args.random_weights:
        return random_weights_model(args.model, dtype, device, tokens)
    target = load_target(args.model, args.model_path, dtype, device, tokens)
    return target.model, target.name


def time_way(model, way: str, repeats: int) -> dict:
    """One column: ms per size it times (``SIZES_OF``), or why it was not measured."""
    from autotune.engine import layers
    from autotune.engine.runner import Runner
    from autotune.errors import AutotuneError
    from autotune.measure.costs import measure_latency_curve

    how, off = WAYS[way]
    device = next(model.parameters()).device
    if how in CUDA_ONLY and device.type != "cuda":
        return {"skipped": "cuda only"}
    runner = Runner(model, static=how is not None, how=how or "graph")
    sizes = SIZES_OF.get(way, SIZES)
    try:  # the step is recorded at its first call of each size, in the form asked
        with layers.forms_answered({off: lambda x: False} if off else {}):
            curve = measure_latency_curve(runner, max(sizes), repeats, sizes=list(sizes))
    except AutotuneError as error:  # a capture or compile refused: said, not fatal here
        return {"skipped": f"failed: {error}"}
    if runner.static is not None and not runner.static.calls:
        return {"skipped": "the step never ran (every call fell back to eager)"}
    return {"ms": {n: 1e3 * curve(n) for n in sizes}}


def step_kernels(model, sizes: tuple[int, ...] = (1, max(SIZES)), rounds: int = 3) -> dict:
    """Where the step's device time goes, per size: its kernels' time a forward, by kernel
    name, under torch's profiler. The fixed-shape step runs eagerly here: the kernels a
    graph replays, each timed by CUPTI (a replayed graph's kernels are not listed). The
    size whose forward grows (64 tokens against 1) shows which kernels grow with it."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    from autotune.engine.runner import Runner
    from autotune.engine.skip import NO_SKIP
    from autotune.measure.costs import CONTEXT_TOKENS, _prepared_cache, _time_forward

    device = next(model.parameters()).device
    if device.type != "cuda":
        return {"skipped": "cuda only"}
    runner = Runner(model, static=True, how="eager")
    cache = _prepared_cache(runner, CONTEXT_TOKENS)
    out = {}
    for n in sizes:
        _time_forward(runner, cache, CONTEXT_TOKENS, n, NO_SKIP)  # warm-up
        with profile(activities=[ProfilerActivity.CUDA]) as run:
            for _ in range(rounds):
                _time_forward(runner, cache, CONTEXT_TOKENS, n, NO_SKIP)
        kernels = [
            (event.name, event.time_range.elapsed_us())
            for event in run.events()
            if event.device_type == DeviceType.CUDA
        ]
        out[str(n)] = kernel_table(kernels, rounds, top=KERNELS_LISTED)
    torch.cuda.synchronize()
    return out


def kernel_table(kernels: list[tuple[str, float]], rounds: int, top: int = 15) -> dict:
    """(name, us) of every kernel run over ``rounds`` forwards -> per forward: the
    kernels' count and total us, and the ``top`` names by time (count and us each)."""
    by_name: dict[str, list[float]] = {}
    for name, us in kernels:
        entry = by_name.setdefault(name, [0, 0.0])
        entry[0] += 1
        entry[1] += us
    ranked = sorted(by_name.items(), key=lambda item: -item[1][1])
    return {
        "kernels": round(len(kernels) / rounds, 1),
        "total_us": round(sum(us for _, us in kernels) / rounds, 1),
        "top": [
            {"name": name[:120], "count": round(count / rounds, 1), "us": round(us / rounds, 1)}
            for name, (count, us) in ranked[:top]
        ],
    }


def table(columns: dict[str, dict]) -> list[str]:
    eager = columns["eager"]["ms"]
    others = {name: column for name, column in columns.items() if name != "eager"}
    lines = [f"{'n':>4}  {'eager ms':>9}" + "".join(f"  {name:>{WIDTH}}" for name in others)]
    for n in SIZES:
        cells = []
        for column in others.values():
            if "ms" not in column:
                cells.append(f"  {column['skipped'][:WIDTH]:>{WIDTH}}")
            elif n not in column["ms"]:
                cells.append(f"  {'-':>{WIDTH}}")
            else:
                ms = column["ms"][n]
                cells.append(f"  {f'{ms:9.3f} ms {ms / eager[n]:5.2f}x':>{WIDTH}}")
        lines.append(f"{n:>4}  {eager[n]:9.3f}" + "".join(cells))
    lines += [
        f"{name}: {column['skipped']}" for name, column in columns.items() if "ms" not in column
    ]
    return lines


def measure(args: argparse.Namespace, model, result: dict, write) -> dict:
    """Into ``result``: the kernels (``--kernels``), then each way's column, each part
    written as it ends (``write``); a part that would start past ``--time-limit`` says
    so instead."""
    import time

    until = time.monotonic() + args.time_limit
    late = {"skipped": f"not started: past --time-limit {args.time_limit:g} s"}
    if args.kernels:
        result["kernels"] = step_kernels(model)
        write(result)
    result["columns"] = {}
    for way in WAYS:
        on_time = time.monotonic() < until
        result["columns"][way] = time_way(model, way, args.repeats) if on_time else late
        write(result)
    return result


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--model-path")
    parser.add_argument("--random-weights", action="store_true")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--kernels", action="store_true", help="also the step's kernels by name, at 1 and 64"
    )
    parser.add_argument("--time-limit", type=float, default=float("inf"), metavar="SECONDS")
    parser.add_argument("--out", type=Path, help="also write the JSON here, after every part")
    return parser.parse_args()


def main() -> int:
    import torch

    from autotune import hardware
    from autotune.files import write_atomic
    from autotune.measure.costs import CONTEXT_TOKENS

    args = parse_args()
    model, name = load_model(args)
    device = next(model.parameters()).device
    info = hardware.describe(str(device))
    result = {
        "model": name,
        "random_weights": args.random_weights,
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "device": f"{info['device']} ({info['device_name']}, {info['threads']} threads)",
        "torch": torch.__version__,
        "repeats": args.repeats,
    }

    def write(done: dict) -> None:
        if args.out is not None:
            write_atomic(args.out, json.dumps(done, indent=2) + "\n")

    measure(args, model, result, write)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(
        f"one forward after a {CONTEXT_TOKENS}-token context: {name} (random weights: "
        f"{str(args.random_weights).lower()}, {result['dtype']}) on {result['device']}, "
        f"torch {torch.__version__}; medians of {args.repeats}, x = time / eager's"
    )
    print("\n".join(table(result["columns"]) + kernel_rows(result.get("kernels") or {})))
    return 0


def kernel_rows(kernels: dict) -> list[str]:
    """``step_kernels``' tally as lines: per size, its count and time, then each name's."""
    lines = []
    for size, found in kernels.items():
        if isinstance(found, dict):  # not the reason it was skipped
            lines.append(f"n={size}: {found['kernels']} kernels, {found['total_us']} us a forward")
            lines += [f"  {r['us']:9.1f} us  x{r['count']:<6} {r['name']}" for r in found["top"]]
    return lines


if __name__ == "__main__":
    from autotune.errors import exit_status

    sys.exit(exit_status(main))
