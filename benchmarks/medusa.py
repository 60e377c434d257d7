"""Medusa: our hardware-sized tree against Medusa's published tree and a plain chain.

    python benchmarks/medusa.py --heads DIR --prompts FILE --max-new-tokens N --json

Variants, each measured against plain greedy decoding in this one process on --prompts,
interleaved prompt by prompt against one shared plain decoding:
  tuned         our search (measured path accuracies, trees sized with this device's
                verify-latency curve, confirmed by wall clock in a study); or the tree of
                --profile when given
  mc_sim_7b_63  Medusa's published 63-node tree, depth and ranks clipped to the heads
  chain         a plain chain as deep as the heads
The search uses the packaged calibration prompts' search split; --prompts is only where
the variants are measured.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# benchmarks/ is on sys.path when run as a script
from _defaults import medusa_defaults
from _report import measure, measuring_arguments, open_workspace, print_report, tune, tuned_ratios

from autotune.drafters.medusa import MedusaDrafter
from autotune.engine.tree import chain_tree
from autotune.methods.medusa.trials import load_heads_for
from autotune.profile.io import read_profile


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heads", required=True, help="Medusa head folder")
    measuring_arguments(parser)
    parser.add_argument(
        "--profile", help="take the tuned tree from this profile instead of searching"
    )
    args = parser.parse_args()

    ws, measure_on = open_workspace(args)
    heads_dir = str(Path(args.heads).expanduser().resolve())
    heads = load_heads_for(ws.ref, heads_dir)

    if args.profile:
        block = read_profile(Path(args.profile)).methods.medusa
        if block is None:
            raise SystemExit(f"{args.profile} has no medusa method")
        tuned, search = block.choices(), {"profile": args.profile}
    else:
        settings = tune(ws, "medusa", heads=heads_dir)
        tuned, search = settings.choices(), settings.search

    published = medusa_defaults(heads.num_heads)
    variants = {"tuned": tuned, **published, "chain": chain_tree(heads.num_heads)}
    measured = measure(
        ws,
        {name: (lambda t=tree: MedusaDrafter(heads, t)) for name, tree in variants.items()},
        measure_on,
        args.max_new_tokens,
    )
    results = {
        name: {
            **measured[name].summary(),
            "nodes": len(tree),
            "depth": max(len(p) for p in tree),
            "tree": [list(p) for p in tree],
        }
        for name, tree in variants.items()
    }
    report = {
        "variants": results,
        "ratios": tuned_ratios(results, (*published, "chain")),
        "search": search,
        "heads": heads_dir,
        "num_heads": heads.num_heads,
        "prompts": args.prompts,
        "max_new_tokens": args.max_new_tokens,
    }
    print_report(report, args.json, "{nodes} nodes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
