"""GLIDE: our tuned draft with the CAPE bins fitted for it, against GLIDE's published CAPE
tables, GLIDE without expansion, a tuned EAGLE head, and plain greedy decoding.

    python benchmarks/glide.py --head DIR [--eagle-head DIR] --prompts FILE \
        --max-new-tokens N --json

Variants, each measured against one shared plain greedy decoding per prompt in this one
process on --prompts, interleaved prompt by prompt:
  glide_fitted_cape   our search (draft length, exit threshold, draft vocabulary; then
                      CAPE's bins and chain length fitted for the draft), or --profile's
  glide_code_floor10  the same chain with GLIDE's code table: k = table[floor(10 p)],
                      8 8 8 6 6 6 4 4 2 2 2 2
  glide_paper_7531    the same chain with GLIDE's paper bins: 7, 5, 3, 1 tokens
  glide               our tuned GLIDE draft without expansion
  eagle               EAGLE tuned by our search (its head trained on the same answers for
                      the same minutes: `autotune heads train --kind eagle --time-budget S`
                      with the S the GLIDE draft had), when --eagle-head is given
  plain_greedy        the baseline every speedup is relative to
The expansions share the fitted verify budget. The search uses the packaged calibration
prompts' search split; --prompts is only where the variants are measured.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

# benchmarks/ is on sys.path when run as a script
from _report import measure, measuring_arguments, open_workspace, print_report

from autotune.budget import Budget
from autotune.drafters.cape import CODE_FLOOR10, PAPER_7531, CapeDrafter, CapePolicy
from autotune.methods import registry
from autotune.methods.base import DraftEnv
from autotune.profile.io import read_profile

PUBLISHED = {"glide_code_floor10": CODE_FLOOR10, "glide_paper_7531": PAPER_7531}


def tuned_blocks(ws, args) -> tuple:
    """(glide block with its fitted cape, eagle block or None, where they came from)."""
    if args.profile:
        methods = read_profile(Path(args.profile)).methods
        glide, eagle = methods.glide, getattr(methods, "eagle", None)
        if glide is None or glide.cape is None:
            raise SystemExit(
                f"{args.profile} has no glide method with a fitted cape block: run "
                "`autotune profile --methods glide,cape --heads glide=DIR`"
            )
        return glide, eagle if args.eagle_head else None, {"profile": args.profile}
    from autotune.profiling.request import ProfileRequest
    from autotune.profiling.setup import make_setup
    from autotune.profiling.tune import fit_expansions, tune_methods, tuning_schedule

    heads = {"glide": args.head, **({"eagle": args.eagle_head} if args.eagle_head else {})}
    request = ProfileRequest(
        model=ws.ref.spec,
        methods=("glide", *(("eagle",) if args.eagle_head else ()), "cape"),
        heads=heads,
        time_budget_s=args.time_budget,
    )
    setup = make_setup(request)
    tuned = tune_methods(setup, ws, request, tuning_schedule(setup, args.time_budget))
    tuned = fit_expansions(setup, ws, tuned, Budget(args.time_budget))
    glide, eagle = tuned["glide"], tuned.get("eagle")
    return glide, eagle, {"glide": glide.search, "cape": glide.cape.search}


def glide_with(glide, env: DraftEnv, policy: CapePolicy):
    """The tuned draft as a chain of the fitted length, widened by ``policy``."""
    base = registry.method("glide").chain_drafter(
        glide, env, max(policy.expansion), glide.cape.chain_depth
    )
    return lambda: CapeDrafter(base(), policy)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head", required=True, help="GLIDE draft folder")
    parser.add_argument("--eagle-head", help="EAGLE head folder trained on the same answers")
    parser.add_argument(
        "--profile", help="take the tuned settings from this profile instead of searching"
    )
    parser.add_argument(
        "--time-budget", type=float, default=600.0, help="seconds for each method's search"
    )
    measuring_arguments(parser)
    args = parser.parse_args()

    ws, measure_on = open_workspace(args)
    glide, eagle, search = tuned_blocks(ws, args)
    glide = glide.model_copy(update={"head": str(Path(args.head).expanduser().resolve())})
    env = DraftEnv(ws.ref, ws.runner)
    fitted = glide.cape.policy()
    policies = {
        "glide_fitted_cape": fitted,
        **{
            name: replace(p, max_verify_tokens=fitted.max_verify_tokens)
            for name, p in PUBLISHED.items()
        },
    }
    makers = {name: glide_with(glide, env, policy) for name, policy in policies.items()}
    makers["glide"] = registry.method("glide").drafter(glide, env)
    if eagle is not None:
        eagle = eagle.model_copy(update={"head": str(Path(args.eagle_head).resolve())})
        makers["eagle"] = registry.method("eagle").drafter(eagle, env)
    measured = measure(ws, makers, measure_on, args.max_new_tokens)

    results = {name: measured[name].summary() for name in makers}
    for name, policy in policies.items():
        results[name].update(bins=list(policy.edges), expansion=list(policy.expansion))
    results["glide"]["draft"] = glide.draft.model_dump()
    baseline = next(iter(measured.values()))
    results["plain_greedy"] = {
        "speedup": 1.0,
        "speedup_interval": [1.0, 1.0],
        "tokens_per_step": 1.0,
        "tokens_per_s": round(baseline.baseline_tokens_per_s, 3),
        "baseline_tokens_per_s": round(baseline.baseline_tokens_per_s, 3),
        "lossless": True,
        "prompts": len(baseline.prompts),
    }
    fitted_speedup = results["glide_fitted_cape"]["speedup"]
    report = {
        "variants": results,
        "ratios": {
            f"fitted_cape_vs_{name}": round(fitted_speedup / results[name]["speedup"], 4)
            for name in results
            if name not in ("glide_fitted_cape", "plain_greedy")
        },
        "glide": {
            "draft": glide.draft.model_dump(),
            "draft_vocab": glide.draft_vocab,
            "chain_depth": glide.cape.chain_depth,
        },
        "search": search,
        "head": glide.head,
        "eagle_head": args.eagle_head,
        "prompts": args.prompts,
        "max_new_tokens": args.max_new_tokens,
    }
    print_report(report, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
