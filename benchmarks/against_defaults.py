"""A profile's tuned setting against its family's published defaults, side by side.

Issue 40's bar "tuned >= 1.15x its family's best published default", measured on the
same device, heads and held-back prompts:

    .venv/bin/python benchmarks/against_defaults.py PROFILE [--model-path FILE]
        [--device cuda] [--dtype auto] [--limit N] [--max-new-tokens N] [--time-limit S]
        [--json] [--out FILE]

The profile's model, heads and prompts are found as `autotune bench` finds them
(``autotune.bench.open_profile``; ``--model-path`` where the model is elsewhere), and the
variants are measured on the held-back split the profile measured on (its first N
prompts: as many as the profile measured, or ``--limit``), each against one plain greedy
decoding per prompt, in this one process, interleaved:
  METHOD             the recommended method's setting as deployed (CAPE where it is on)
  default: NAME      each published default of its family (``benchmarks/_defaults.py``):
                     n-gram: transformers' prompt lookup, vLLM's ngram and suffix
                     defaults; EAGLE: EAGLE-1's static tree and EAGLE-2's 60/5/10 on the
                     profile's head; Medusa: mc_sim_7b_63 clipped to the profile's heads
A family with no published default (self-spec, GLIDE) is said so in one line. Printed:
each variant's speedup with its 95% interval and whether its output equalled greedy's
token for token, then the tuned setting over the best default, with a 95% interval from
a paired bootstrap over prompts (``--json``: all of it as one JSON document; ``--out``:
that document written to a file too).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from functools import partial
from pathlib import Path

# benchmarks/ is on sys.path when run as a script
from _defaults import EAGLE_DEFAULTS, NO_DEFAULT, medusa_defaults, ngram_defaults
from _report import MACHINE, machine_line, measure, paired_ratio

DEFAULT = "default: "  # the name of a published default's variant starts so


@dataclass(frozen=True)
class Options:
    """How to measure: where the model is, on what, how many prompts and tokens."""

    model_path: str | None = None
    device: str = "auto"
    dtype: str = "auto"  # auto: the profile's
    limit: int | None = None  # held-back prompts (None: as many as the profile measured)
    max_new_tokens: int | None = None  # None: the profile's
    every_method: bool = False  # the profile's other methods beside the recommended one
    time_limit: float | None = None  # seconds: no prompt is started after (but the first 2)


def against_defaults(path: Path, options: Options = Options()) -> dict:
    """The side by side as one JSON-ready dict: ``variants`` (each one's summary against
    greedy), ``method`` (the recommended one, a key of ``variants``), ``defaults`` (its
    family's published defaults' keys), ``ratio`` (the tuned setting over the best of
    them, with its interval; None where there is none) and ``no_default`` (why there is
    none, in one line)."""
    from autotune.bench import open_profile
    from autotune.budget import Budget
    from autotune.profile.io import read_profile

    tokens = options.max_new_tokens or read_profile(path).workload.max_new_tokens
    profile, ws, env = open_profile(
        path, None, tokens, options.model_path, options.dtype, options.device
    )
    method, tuned = profile.recommended, profile.block(profile.recommended)
    defaults = family_defaults(method, tuned, env) if tuned is not None else {}
    result: dict = {
        "profile": str(path),
        "method": method,
        "device": ws.ref.device,
        "dtype": ws.ref.dtype,
        "max_new_tokens": tokens,
        "defaults": [DEFAULT + name for name in defaults],
        "no_default": None if defaults else no_default_line(method, tuned),
        "ratio": None,
    }
    if not defaults and not options.every_method:  # nothing to compare: nothing decoded
        return {**result, "prompts": 0, "variants": {}}
    variants = tuned_variants(profile, env, options.every_method)
    variants |= {DEFAULT + name: variant for name, variant in defaults.items()}
    heldback = ws.encode(ws.heldback_prompts())
    prompts = heldback[: options.limit or measured_count(profile) or len(heldback)]
    until = Budget(options.time_limit) if options.time_limit else None
    measured = measure(ws, variants, prompts, tokens, until)
    result["ratio"] = over_best_default(measured, method, result["defaults"])
    return {
        **result,
        "prompts": min((len(m.prompts) for m in measured.values()), default=0),
        "variants": {name: m.summary() for name, m in measured.items()},
        "machine": MACHINE.as_dict(),
    }


def family_defaults(method: str, tuned, env) -> dict:
    """The published defaults of ``method``'s family as variants to measure, by name: on
    the tuned setting's heads where the family drafts with heads, without CAPE (none of
    them ships it)."""
    from autotune.drafters.ngram import NgramDrafter
    from autotune.measure.timing import Variant
    from autotune.methods import registry

    if method == "ngram":
        return {n: Variant(partial(NgramDrafter, c)) for n, c in ngram_defaults().items()}
    if method == "eagle":
        from autotune.methods.eagle.settings import tree_block

        # the published trees draft over the whole vocabulary, as EAGLE-1 and -2 do
        changes = {
            name: {"tree": tree_block(tree), "draft_vocab": 0, "cape": None}
            for name, tree in EAGLE_DEFAULTS.items()
        }
    elif method == "medusa":
        from autotune.methods.medusa.trials import load_heads_for

        heads = load_heads_for(env.ref, env.resolve(tuned.heads)).num_heads
        changes = {
            name: {"tree": [list(path) for path in tree], "num_heads": heads}
            for name, tree in medusa_defaults(heads).items()
        }
    else:
        return {}
    drafts = registry.method(method)
    return {name: drafts.variant(tuned.model_copy(update=c), env) for name, c in changes.items()}


def no_default_line(method: str, tuned) -> str:
    if tuned is None:
        return f"the profile recommends no method (recommended: {method}): nothing to compare"
    why = NO_DEFAULT.get(method, "none is known to this script")
    return f"{method} has no published default to measure against: {why}"


def tuned_variants(profile, env, every_method: bool) -> dict:
    """The recommended method's variant as the profile deploys it; with ``every_method``,
    every method's section of the profile (the race's dropped too)."""
    from autotune.methods import registry

    blocks = profile.method_blocks()
    names = list(blocks) if every_method else [n for n in blocks if n == profile.recommended]
    return {name: registry.method(name).variant(blocks[name], env) for name in names}


def measured_count(profile) -> int | None:
    """How many held-back prompts the profile measured its methods on (the most of any)."""
    counts = [b.measured.prompts for b in profile.method_blocks().values() if b.measured]
    return max(counts, default=None)


def over_best_default(measured: dict, method: str, defaults: list[str]) -> dict | None:
    """The tuned setting's throughput over the fastest default's, paired over prompts."""
    if method not in measured or not defaults:
        return None
    best = max(defaults, key=lambda name: measured[name].speedup)
    ratio, interval = paired_ratio(measured[method], measured[best])
    return {
        "value": round(ratio, 4),
        "interval": interval.as_list(),
        "best_default": best.removeprefix(DEFAULT),
        "prompts": interval.prompts,
    }


def variant_lines(result: dict) -> list[str]:
    """The prompts, the machine, and each variant against greedy, fastest first."""
    from autotune.measure.timing import interval_text

    rows = sorted(result["variants"].items(), key=lambda kv: -kv[1]["speedup"])
    return [
        f"on the {result['prompts']} held-back prompts, side by side against plain greedy:",
        f"during the side-by-side, {machine_line(result.get('machine') or {})}",
        *(f"  {name:<36} {interval_text(row)}  lossless {row['lossless']}" for name, row in rows),
    ]


def ratio_line(result: dict) -> str:
    ratio = result["ratio"]
    if ratio is None:
        return result["no_default"] or f"{result['method']} was not measured"
    low, high = ratio["interval"]
    return (
        f"tuned {result['method']} / best published default ({DEFAULT}{ratio['best_default']}): "
        f"{ratio['value']:.3f}x [{low:.3f}, {high:.3f}] paired over {ratio['prompts']} prompts"
    )


def arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile", type=Path, help="a profile written by `autotune profile`")
    parser.add_argument("--model-path", help="the profile's model, where bench cannot find it")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    parser.add_argument("--dtype", default="auto", help="auto: the profile's own")
    parser.add_argument("--limit", type=int, help="measure the first N held-back prompts")
    parser.add_argument("--max-new-tokens", type=int, help="default: the profile's")
    parser.add_argument("--time-limit", type=float, help="start no prompt after SECONDS")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--out", type=Path, help="write the JSON document to this file too")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from autotune.files import write_atomic

    args = arguments(argv)
    options = Options(
        args.model_path, args.device, args.dtype, args.limit, args.max_new_tokens,
        time_limit=args.time_limit,
    )  # fmt: skip
    result = against_defaults(args.profile, options)
    document = json.dumps(result, indent=1)
    if args.out is not None:
        write_atomic(args.out, document + "\n")
    if args.json:
        print(document)
    else:
        print("\n".join(variant_lines(result) if result["variants"] else []))
        print(ratio_line(result))
    return 0


if __name__ == "__main__":
    from autotune.errors import exit_status

    sys.exit(exit_status(main))
