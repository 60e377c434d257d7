"""llama.cpp's own draft-free speculation, measured in llama-server itself: every
speculative type it has without a draft model (ngram-simple over a grid of n and m,
ngram-mod, ngram-map-k, ngram-cache, and its --spec-default) against its greedy decoding,
on search prompts of the packaged workload, interleaved, with 95% intervals and each
output checked against greedy. What the engine can express, and what it gains there:

    python benchmarks/llamacpp_grid.py [--prompts 16] [--max-new-tokens 128] [--json]

llama.cpp must be built first (``autotune engines build llamacpp``); the model is the
embedded SmolLM2-135M GGUF (Q4_1), or --gguf FILE with --model SPEC for its tokenizer.
"""

from __future__ import annotations

import argparse
import json
import sys

from autotune.measure.timing import EncodedPrompt, interval_text
from autotune.serving import llamacpp
from autotune.verify import side_by_side


def grid() -> dict[str, list[str]]:
    variants = {"--spec-default": ["--spec-default"]}
    for n in (2, 3, 4):
        for m in (3, 6, 10, 16):
            if m >= n:  # ngram-simple drafts only where at least n tokens follow a match
                variants[f"ngram-simple n={n} m={m}"] = [
                    *("--spec-type", "ngram-simple"),
                    *("--spec-ngram-simple-size-n", str(n), "--spec-ngram-simple-size-m", str(m)),
                ]
    for match, low, high in ((8, 8, 16), (12, 12, 32), (16, 16, 32)):
        variants[f"ngram-mod match={match} n={low}-{high}"] = [
            *("--spec-type", "ngram-mod", "--spec-ngram-mod-n-match", str(match)),
            *("--spec-ngram-mod-n-min", str(low), "--spec-ngram-mod-n-max", str(high)),
        ]
    variants["ngram-map-k"] = ["--spec-type", "ngram-map-k"]
    return variants


def main(argv: list[str]) -> int:
    from autotune.models import load_target, resolve_model
    from autotune.prompts import default_prompts_path, load_prompts, split_prompts

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=16, help="search prompts")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--gguf", default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    target = load_target(args.model)
    gguf = args.gguf or resolve_model(args.model).path
    search, _ = split_prompts(load_prompts(default_prompts_path()))
    prompts = [
        EncodedPrompt(p.id, target.encode_chat(p.text), p.category) for p in search[: args.prompts]
    ]
    rows = {}
    with llamacpp.Server(gguf) as greedy:
        for name, flags in grid().items():
            with llamacpp.Server(gguf, flags) as server:
                measured = side_by_side(
                    {"greedy": greedy.decode, name: server.decode}, prompts, args.max_new_tokens
                )[name]
            rows[name] = measured.summary(with_categories=False)
            if not args.json:
                print(
                    f"{name:<34} {interval_text(measured)}  {measured.tokens_per_step:.2f} "
                    f"tokens/step, lossless {measured.lossless}",
                    flush=True,
                )
    if args.json:
        print(json.dumps({"release": llamacpp.release(), "variants": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
