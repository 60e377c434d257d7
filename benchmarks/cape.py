"""CAPE: our fitted confidence bins against GLIDE's hand-set ones, on one chain drafter.

    python benchmarks/cape.py --profile PROFILE --drafter self_spec|eagle --prompts FILE \
        --max-new-tokens N --json

Variants, each the profile's drafter (its tuned layer-skip draft, or its EAGLE head as a
chain of the fitted depth) with one expansion policy, each measured against plain greedy
decoding in this one process on --prompts:
  fitted        the profile's `cape` block (bins and sizes fitted by `autotune profile
                --methods self-spec,cape` or `eagle,cape` on the search split)
  paper_7531    GLIDE's paper: (0,.3],(.3,.6],(.6,.8],(.8,1] -> 7, 5, 3, 1 tokens
  code_floor10  GLIDE's code: table[floor(10 p)] = 8 8 8 6 6 6 4 4 2 2 2 -> 8, 6, 4, 2
  no_expansion  the chain alone
All use the fitted verify budget. Plain greedy and the variants are decoded interleaved,
prompt by prompt; a variant whose policy equals an earlier one's (the fit may choose no
expansion) is that one's measurement, marked `same_as`. --prompts is only where the
variants are measured.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

# benchmarks/ is on sys.path when run as a script
from _report import measure, measuring_arguments, print_report

from autotune.drafters.cape import NO_EXPANSION, PUBLISHED, CapeDrafter, CapePolicy
from autotune.methods import registry
from autotune.methods.base import DraftEnv
from autotune.models.ref import TargetRef
from autotune.profile.io import read_profile
from autotune.prompts import load_prompts
from autotune.workspace import Workspace


def cape_drafter(method: str, block, env: DraftEnv, policy: CapePolicy):
    """The method's chain drafter (its chain of the fitted depth) with ``policy``."""
    base = registry.get(method).chain_drafter(
        block, env, max(policy.expansion), block.cape.chain_depth
    )
    return lambda: CapeDrafter(base(), policy)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", required=True, help="a profile with a fitted cape block")
    parser.add_argument(
        "--drafter", required=True, choices=[n for n, e in registry.methods().items() if e.chain]
    )
    measuring_arguments(parser)
    args = parser.parse_args()

    profile = read_profile(Path(args.profile))
    block = profile.block(args.drafter)
    if block is None or block.cape is None:
        raise SystemExit(
            f"{args.profile} has no fitted cape block for {args.drafter}: run "
            f"`autotune profile --methods {args.drafter},cape`"
        )
    ws = Workspace.open(
        TargetRef.for_user(profile.model.name, args.model_path or profile.model.path),
        args.prompts,
        storage=None,
        need_storage=False,
    )
    measure_on = ws.encode(load_prompts(args.prompts)[: args.limit])
    env = DraftEnv(ws.ref, ws.runner, Path(args.profile).resolve().parent)

    fitted = block.cape.policy()
    budget = fitted.max_verify_tokens
    variants = {
        "fitted": fitted,
        **{name: replace(p, max_verify_tokens=budget) for name, p in PUBLISHED.items()},
        "no_expansion": replace(NO_EXPANSION, max_verify_tokens=budget),
    }
    # a policy equal to another is measured once: two timings of one setting differ
    # only by noise
    first_of = {}
    for name, policy in variants.items():
        first_of.setdefault(policy, name)
    unique = {name: policy for policy, name in first_of.items()}
    measured = measure(
        ws,
        {name: cape_drafter(args.drafter, block, env, policy) for name, policy in unique.items()},
        measure_on,
        args.max_new_tokens,
    )
    results = {}
    for name, policy in variants.items():
        first = first_of[policy]
        results[name] = {
            **measured[first].summary(),
            "bins": list(policy.edges),
            "expansion": list(policy.expansion),
            **({"same_as": first} if first != name else {}),
        }
    fitted_speedup = results["fitted"]["speedup"]
    report = {
        "variants": results,
        "ratios": {
            f"fitted_vs_{k}": round(fitted_speedup / results[k]["speedup"], 4)
            for k in results
            if k != "fitted"
        },
        "drafter": args.drafter,
        "chain_depth": block.cape.chain_depth,
        "profile": args.profile,
        "prompts": args.prompts,
        "max_new_tokens": args.max_new_tokens,
    }
    print_report(report, args.json, extra="{expansion}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
