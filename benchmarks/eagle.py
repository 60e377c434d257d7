"""EAGLE: our tuned tree against EAGLE-1's static tree and EAGLE-2's default expansion.

    python benchmarks/eagle.py --head DIR --prompts FILE --max-new-tokens N --json

Variants, each measured against plain greedy decoding in this one process on --prompts,
interleaved prompt by prompt against one shared plain decoding:
  tuned           our search (a static tree from the head's measured path accuracies and
                  EAGLE-2 expansion settings, both confirmed by wall clock in studies, the
                  faster of the two chosen on search prompts), or the tree of --profile
  eagle1_tree     EAGLE-1's published 25-node static tree
  eagle2_60_5_10  EAGLE-2's default dynamic expansion: total_tokens 60, depth 5, top_k 10
The search uses the packaged calibration prompts' search split; --prompts is only where
the variants are measured.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# benchmarks/ is on sys.path when run as a script
from _defaults import EAGLE_DEFAULTS
from _report import measure, measuring_arguments, open_workspace, print_report, tune, tuned_ratios

from autotune.drafters.eagle import EagleDrafter
from autotune.methods.eagle.settings import tree_block
from autotune.methods.eagle.trials import load_head_for, projection_for
from autotune.profile.io import read_profile


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head", required=True, help="EAGLE head folder")
    measuring_arguments(parser)
    parser.add_argument(
        "--profile", help="take the tuned tree from this profile instead of searching"
    )
    args = parser.parse_args()

    ws, measure_on = open_workspace(args)
    head_dir = str(Path(args.head).expanduser().resolve())
    head = load_head_for(ws.ref, head_dir)  # a head that does not fit fails here

    if args.profile:
        settings = read_profile(Path(args.profile)).methods.eagle
        if settings is None:
            raise SystemExit(f"{args.profile} has no eagle method")
        search = {"profile": args.profile}
    else:
        settings = tune(ws, "eagle", heads=head_dir)
        search = settings.search

    # the published settings draft over the whole vocabulary, as EAGLE-1 and -2 do
    variants = {
        "tuned": (settings.drafting_tree(), settings.draft_vocab),
        **{name: (tree, 0) for name, tree in EAGLE_DEFAULTS.items()},
    }
    makers = {
        name: (lambda t=tree, p=projection_for(ws.ref, head_dir, vocab): EagleDrafter(head, t, p))
        for name, (tree, vocab) in variants.items()
    }
    measured = measure(ws, makers, measure_on, args.max_new_tokens)
    results = {
        name: {
            **measured[name].summary(),
            "tree": tree_block(tree).model_dump(),
            "draft_vocab": vocab,
        }
        for name, (tree, vocab) in variants.items()
    }
    report = {
        "variants": results,
        "ratios": tuned_ratios(results, EAGLE_DEFAULTS),
        "search": search,
        "head": head_dir,
        "prompts": args.prompts,
        "max_new_tokens": args.max_new_tokens,
    }
    print_report(report, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
