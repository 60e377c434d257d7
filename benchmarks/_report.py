"""Output shared by the benchmark scripts: JSON, or one line per variant."""
from __future__ import annotations

import json

from autotune.progress import say


def print_report(report: dict, as_json: bool, extra: str = "") -> None:
    """``extra``: a format string over a variant's row, appended to its line."""
    if as_json:
        print(json.dumps(report, indent=2))
        return
    for name, row in report["variants"].items():
        say(f"{name:13} {row['speedup']:.3f}x  {row['tokens_per_step']:.2f} tokens/step  "
            + (extra.format(**row) + "  " if extra else "") + f"lossless {row['lossless']}")
    say(json.dumps(report["ratios"]))
