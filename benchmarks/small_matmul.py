"""How much the engine's small-batch matmul path saves on this machine.

Prints the time of one target forward over n new tokens (after a 160-token context)
with torch's default linear layers and with autotune's, and their ratio:

    python benchmarks/small_matmul.py [--model smollm2-135m] [--max-tokens 16] [--json]
"""

from __future__ import annotations

import argparse
import json

from autotune.engine.layers import plain_linear
from autotune.engine.runner import Runner
from autotune.measure.costs import measure_latency_curve
from autotune.models import load_target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    model = load_target(args.model).model
    default = measure_latency_curve(
        Runner(model, product=plain_linear), args.max_tokens, args.repeats
    )
    ours = measure_latency_curve(Runner(model), args.max_tokens, args.repeats)
    rows = {
        n: {
            "default_ms": 1e3 * default(n),
            "autotune_ms": 1e3 * ours(n),
            "ratio": default(n) / ours(n),
        }
        for n in range(1, args.max_tokens + 1)
    }
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    for n, row in rows.items():
        print(
            f"n={n:3d}  default {row['default_ms']:7.1f} ms  autotune {row['autotune_ms']:7.1f} ms"
            f"  {row['ratio']:.2f}x"
        )


if __name__ == "__main__":
    main()
