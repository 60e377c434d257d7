"""Where the engine stands against this machine's floor, and against transformers.

Prints this machine's roofline for the model (memory bandwidth, GEMM peak), the engine's
forward over n new tokens (after a 160-token context) beside its floor, the three checks of
the engine issue (one token <= 1.3x its floor; 8 tokens <= 1.25x one token; 16 tokens
<= 1.6x), and plain greedy tokens/s of the engine and of transformers' ``generate`` on the
same prompts, interleaved prompt by prompt in one process, with a 95% interval over prompts:

    python benchmarks/roofline.py [--prompts 8] [--max-new-tokens 64] [--json]

``--greedy-only`` skips the curve (it also runs against older trees of the project, whose
engine/transformers ratio is the yardstick for "faster than before" across two runs).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from autotune.engine.decoding import decode_plain
from autotune.engine.runner import Runner
from autotune.measure.stats import Pairs, bootstrap_interval
from autotune.models import load_target
from autotune.prompts import load_prompts, packaged_prompt_files

SIZES = (1, 2, 4, 8, 16, 32, 64)
CHECKS = (  # (what, value's key, bar)
    ("one token / its floor", "floor_ratio_1", 1.3),
    ("8 tokens / one token", "relative_8", 1.25),
    ("16 tokens / one token", "relative_16", 1.6),
)


def curve_rows(runner: Runner) -> dict:
    from autotune.measure.costs import measure_latency_curve
    from autotune.measure.roofline import measure_roofline

    roofline = measure_roofline(runner)
    curve = measure_latency_curve(runner, max(SIZES), repeats=7, sizes=list(SIZES))
    rows = {
        n: {
            "ms": 1e3 * curve(n),
            "relative": curve(n) / curve(1),
            "floor_ms": 1e3 * roofline.floor(n),
            "x_floor": curve(n) / roofline.floor(n),
        }
        for n in SIZES
    }
    return {
        "roofline": roofline.summary() | {"formula": roofline.formula()},
        "rows": rows,
        "floor_ratio_1": rows[1]["x_floor"],
        "relative_8": rows[8]["relative"],
        "relative_16": rows[16]["relative"],
    }


def greedy_side_by_side(target, runner: Runner, count: int, max_new_tokens: int) -> dict:
    """Engine and transformers greedy on the same prompts, their order alternating."""
    prompts = [p for path in packaged_prompt_files() for p in load_prompts(path)][:count]
    encoded = [target.encode_chat(p.text) for p in prompts]

    def engine(ids):
        start = time.perf_counter()
        tokens = decode_plain(runner, ids, max_new_tokens).tokens
        return time.perf_counter() - start, tokens

    def transformers(ids):
        start = time.perf_counter()
        with torch.inference_mode():
            out = target.model.generate(
                torch.tensor([ids]), do_sample=False, max_new_tokens=max_new_tokens
            )
        return time.perf_counter() - start, out[0, len(ids) :].tolist()

    engine(encoded[0])  # warm-up: first-call allocations, kernel choices
    transformers(encoded[0])
    rows, same = [], 0
    for index, ids in enumerate(encoded):
        order = (engine, transformers) if index % 2 == 0 else (transformers, engine)
        timed = {f: f(ids) for f in order}
        (e_s, e_tok), (t_s, t_tok) = timed[engine], timed[transformers]
        same += e_tok == t_tok
        rows.append((e_s, len(e_tok), t_s, len(t_tok)))
    pairs = Pairs.of(rows)
    ratio = (pairs.method_tokens.sum() / pairs.method_seconds.sum()) / (
        pairs.baseline_tokens.sum() / pairs.baseline_seconds.sum()
    )
    interval = bootstrap_interval(pairs)
    return {
        "prompts": len(rows),
        "engine_tokens_per_s": float(pairs.method_tokens.sum() / pairs.method_seconds.sum()),
        "transformers_tokens_per_s": float(
            pairs.baseline_tokens.sum() / pairs.baseline_seconds.sum()
        ),
        "engine_over_transformers": float(ratio),
        "interval": interval.as_list(),
        "same_tokens": same,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--greedy-only", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    target = load_target(args.model)
    runner = Runner(target.model)
    result: dict = {"threads": torch.get_num_threads()}
    if not args.greedy_only:
        result["curve"] = curve_rows(runner)
    result["greedy"] = greedy_side_by_side(target, runner, args.prompts, args.max_new_tokens)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    if "curve" in result:
        curve = result["curve"]
        print(curve["roofline"]["formula"])
        for n, row in curve["rows"].items():
            print(
                f"n={n:3d}  {row['ms']:7.1f} ms  x{row['relative']:.2f} of one token  "
                f"floor {row['floor_ms']:6.1f} ms  x{row['x_floor']:.2f} of floor"
            )
        for what, key, bar in CHECKS:
            verdict = "met" if curve[key] <= bar else "NOT met"
            print(f"{what}: {curve[key]:.2f} (bar <= {bar}) {verdict}")
    greedy = result["greedy"]
    low, high = greedy["interval"]
    print(
        f"greedy on {greedy['prompts']} prompts: engine {greedy['engine_tokens_per_s']:.1f} "
        f"tokens/s, transformers generate {greedy['transformers_tokens_per_s']:.1f} tokens/s: "
        f"{greedy['engine_over_transformers']:.2f}x [{low:.2f}, {high:.2f}]; same tokens on "
        f"{greedy['same_tokens']} of {greedy['prompts']} prompts"
    )


if __name__ == "__main__":
    main()
