"""EAGLE: our tuned tree against EAGLE-1's static tree and EAGLE-2's default expansion.

    python benchmarks/eagle.py --head DIR --prompts FILE --max-new-tokens N --json

Variants, each measured against plain greedy decoding in this one process on --prompts:
  tuned           our search (a static tree from the head's measured path accuracies and
                  EAGLE-2 expansion settings, both confirmed by wall clock in studies; the
                  one faster in its study), or the tree of --profile when given
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
from _report import measuring_arguments, open_workspace, print_report, tuned_ratios
from autotune.drafters.eagle import EAGLE1_TREE, DynamicTree, StaticTree
from autotune.profile.io import read_profile
from autotune.tuners.eagle import (EagleChoice, EagleSearch, load_head_for,
                                   measure_eagle_tree, tree_from_settings, tree_settings)
from autotune.tuners.self_spec import SearchLimits
from autotune.tuners.space import load_eagle_space
from autotune.workspace import Workspace


def searched_tree(ws: Workspace, head_dir: str):
    """The faster of the two studies' winners (an EagleChoice), judged on the search
    split only."""
    search = EagleSearch(ws, load_eagle_space(), head_dir, SearchLimits())
    winners = search.run()
    best = {kind: search.info[f"{kind}_trials"][0]["speedup"] for kind in winners
            if search.info.get(f"{kind}_trials")}
    kind = max(best, key=best.get) if best else next(iter(winners))
    return winners[kind], search.info


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head", required=True, help="EAGLE head folder")
    measuring_arguments(parser)
    parser.add_argument("--profile", help="take the tuned tree from this profile instead "
                                          "of searching")
    args = parser.parse_args()

    ws, measure_on = open_workspace(args)
    head_dir = str(Path(args.head).expanduser().resolve())
    load_head_for(ws.ref, head_dir)  # a head that does not fit fails here, before searching

    if args.profile:
        block = read_profile(Path(args.profile)).methods.eagle
        if block is None:
            raise SystemExit(f"{args.profile} has no eagle method")
        tuned = EagleChoice(tree_from_settings(block.tree.model_dump()), block.draft_vocab)
        search = {"profile": args.profile}
    else:
        tuned, search = searched_tree(ws, head_dir)

    # the published settings draft over the whole vocabulary, as EAGLE-1 and -2 do
    variants = {"tuned": tuned, "eagle1_tree": EagleChoice(StaticTree(EAGLE1_TREE), 0),
                "eagle2_60_5_10": EagleChoice(DynamicTree(total_tokens=60, depth=5, top_k=10), 0)}
    results = {}
    for name, choice in variants.items():
        m = measure_eagle_tree(ws, head_dir, choice, measure_on, args.max_new_tokens,
                               f"measure {name}")
        results[name] = {**m.summary(), "tree": tree_settings(choice.tree),
                         "draft_vocab": choice.vocab}
    report = {
        "variants": results,
        "ratios": tuned_ratios(results, ("eagle1_tree", "eagle2_60_5_10")),
        "search": search, "head": head_dir,
        "prompts": args.prompts, "max_new_tokens": args.max_new_tokens,
    }
    print_report(report, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
