"""Draft acceptance and draft cost against skip ratio, from a finished skip-mask study.

    python benchmarks/acceptance_vs_skip.py --storage sqlite:///studies/autotune.db \
        --study smollm2-135m/self_spec/skip_mask [--json]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

import optuna


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--storage", default="sqlite:///studies/autotune.db")
    parser.add_argument("--study", default="smollm2-135m/self_spec/skip_mask")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    study = optuna.load_study(study_name=args.study, storage=args.storage)
    bins = defaultdict(list)
    for trial in study.get_trials(states=(optuna.trial.TrialState.COMPLETE,)):
        attrs = trial.user_attrs
        if attrs.get("feasible"):
            bins[round(attrs["skip_ratio"] * 10) / 10].append(attrs)
    rows = []
    for ratio in sorted(bins):
        group = bins[ratio]
        rows.append(
            {
                "skip_ratio": ratio,
                "masks": len(group),
                "first_token_acceptance_mean": round(
                    sum(a["acceptance"] for a in group) / len(group), 3
                ),
                "first_token_acceptance_best": round(max(a["acceptance"] for a in group), 3),
                "draft_cost_relative": round(sum(a["draft_ratio"] for a in group) / len(group), 3),
                "proxy_speedup_best": round(max(a["objective"] for a in group), 3),
            }
        )
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print("skip_ratio masks acceptance(mean/best) draft_cost proxy_speedup_best")
    for r in rows:
        print(
            f"{r['skip_ratio']:10.1f} {r['masks']:5d} {r['first_token_acceptance_mean']:.3f}/"
            f"{r['first_token_acceptance_best']:.3f}        {r['draft_cost_relative']:.3f}"
            f"      {r['proxy_speedup_best']:.3f}"
        )


if __name__ == "__main__":
    main()
