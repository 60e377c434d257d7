"""A profile's exports measured in the engines that serve them, on its held-back prompts:
llama.cpp's llama-server with no speculation, with its own default (--spec-default) and
with autotune's export; transformers' generate greedy, with prompt_lookup_num_tokens=10 and
with autotune's hf export. Every speedup is over that engine's own greedy decoding, with a
95% paired-bootstrap interval over prompts, and every output is checked token for token
against that greedy output (``autotune verify``, without writing the profile):

    python benchmarks/engines.py PROFILE [--limit N] [--max-new-tokens N] [--tune 5m] [--json]

``--tune``: llama.cpp's n-gram setting is first tuned in llama-server itself on the search
prompts (``autotune verify --tune``), and that setting is the export measured.

llama.cpp must be built first (``autotune engines build llamacpp``). The goal the engines
issue sets: the export >= 1.1x the engine's own default, and above 1.0 with its interval,
in each engine.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from autotune.schedule import parse_duration
from autotune.verify import EXPORT, report_lines, verify

GOAL_OVER_DEFAULT = 1.1


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile", type=Path)
    parser.add_argument("--limit", type=int, default=None, help="held-back prompts at most")
    parser.add_argument("--max-new-tokens", type=int, default=None)
    parser.add_argument("--engines", default="llamacpp,hf")
    parser.add_argument("--tune", default=None, help="llama.cpp: tune in it first (5m)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    out = {}
    for engine in args.engines.split(","):
        tune_s = parse_duration(args.tune) if args.tune and engine == "llamacpp" else None
        report = verify(
            args.profile, engine, args.limit, args.max_new_tokens, record=False, tune_s=tune_s
        )
        export = report.variants[EXPORT]
        summary = report.summary()
        summary["goal_met"] = (
            report.over_default() >= GOAL_OVER_DEFAULT and export.interval().low > 1.0
        )
        out[engine] = summary
        if not args.json:
            print("\n".join(report_lines(report)))
            met = "met" if summary["goal_met"] else "NOT met"
            print(
                f"goal (export >= {GOAL_OVER_DEFAULT}x the engine's default, interval above "
                f"1.0): {met}\n"
            )
    if args.json:
        print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
