"""Self-speculative decoding: our search against the published way, measured side by side.

    python benchmarks/self_spec.py --prompts FILE --max-new-tokens N --json

Variants, each measured against plain greedy decoding in this one process on --prompts,
interleaved prompt by prompt against one shared plain decoding:
  tuned         our search (proxy Bayesian optimisation, confirmation, draft-exit tuning)
  dv_baseline   the same number of trials spent the Draft & Verify way (UCB BO on raw
                tokens/s of 8 prompts x 32 tokens, its default draft exit)
  fixed_middle  the middle 40% of attention sublayers skipped, Draft & Verify's draft exit
Both searches use the packaged calibration prompts' search split; --prompts is only
where the variants are measured.
"""

from __future__ import annotations

import argparse
import sys

# benchmarks/ is on sys.path when run as a script
from _report import measure, measuring_arguments, open_workspace, print_report, tune, tuned_ratios

from autotune.drafters.self_spec import DV_DEFAULT_POLICY, LayerSkipDrafter
from autotune.progress import step
from autotune.tuners.dv_baseline import dv_search
from autotune.tuners.skip_mask import middle_attention_mask


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    measuring_arguments(parser)
    parser.add_argument("--trials", type=int, default=None, help="skip-mask trials of our search")
    args = parser.parse_args()

    ws, measure_on = open_workspace(args)
    settings = tune(ws, "self_spec", trials=args.trials)
    budget = settings.search["mask_trials"] + settings.search["exit_trials"]
    search_split = ws.encode(ws.search_prompts())
    with step(f"dv_baseline search ({budget} trials)", budget) as advance:
        dv_mask, dv_values = dv_search(
            ws.runner, [p.ids for p in search_split], budget, on_trial=lambda _: advance()
        )

    variants = {
        "tuned": (settings.skip_mask(), settings.exit_policy()),
        "dv_baseline": (dv_mask, DV_DEFAULT_POLICY),
        "fixed_middle": (middle_attention_mask(ws.runner.num_layers), DV_DEFAULT_POLICY),
    }
    measured = measure(
        ws,
        {
            name: (lambda s=skip, p=policy: LayerSkipDrafter(s, p))
            for name, (skip, policy) in variants.items()
        },
        measure_on,
        args.max_new_tokens,
    )
    results = {}
    for name, (skip, policy) in variants.items():
        results[name] = {
            **measured[name].summary(),
            "skip": skip.as_dict(),
            "draft": {
                "max_tokens": policy.max_tokens,
                "exit_threshold": round(policy.exit_threshold, 4),
                "adaptive": policy.adaptive is not None,
            },
        }
    report = {
        "variants": results,
        "ratios": tuned_ratios(results, ("dv_baseline", "fixed_middle")),
        "search": {
            "tuned": settings.search,
            "dv_baseline_trials": len(dv_values),
            "dv_baseline_best_tokens_per_s": round(max(dv_values), 3),
        },
        "prompts": args.prompts,
        "max_new_tokens": args.max_new_tokens,
    }
    print_report(report, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
