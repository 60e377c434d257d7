"""How fast the profile's answers phase decodes: the engine's batched greedy decoding
(``distill.decode_answers``, what the phase runs) against transformers' ``generate``
batched with left padding (what it ran before, ``generated`` here), on the same packaged
prompts, alternately, and whether the answers are the same:

    python benchmarks/answers.py [--prompts 16] [--max-new-tokens 64] [--rounds 2]
        [--model-path FILE] [--device cpu] [--dtype float32] [--json]

Each round times both on every prompt, 16 at a time (``distill.GENERATION_BATCH``); the
ratio is generate's seconds over the engine's, per round. The engine's answers are each
prompt's own greedy output; ``generate``'s may differ where left padding moves a near
tie, and the count of equal answers says how often.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from autotune.engine.runner import eos_ids
from autotune.models.ref import TargetRef
from autotune.prompts import default_prompts_path, load_prompts
from autotune.training.distill import GENERATION_BATCH, decode_answers


def generated(model, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """transformers' greedy ``generate``, GENERATION_BATCH prompts at a time, prompts of
    similar length together and left-padded; each answer ends at its first end token."""
    eos = sorted(eos_ids(model))
    pad_id = eos[0] if eos else 0  # masked out: any id will do
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    answers: dict[int, list[int]] = {}
    for start in range(0, len(order), GENERATION_BATCH):
        batch = order[start : start + GENERATION_BATCH]
        width = max(len(prompts[i]) for i in batch)
        pad = [[pad_id] * (width - len(prompts[i])) for i in batch]
        ids = torch.tensor([p + prompts[i] for p, i in zip(pad, batch)], device=model.device)
        mask = torch.tensor([[0] * len(p) + [1] * len(prompts[i]) for p, i in zip(pad, batch)])
        out = model.generate(
            input_ids=ids,
            attention_mask=mask.to(model.device),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=eos or None,
            pad_token_id=pad_id,
        )
        for i, row in zip(batch, out[:, width:].tolist()):
            ends = [k for k, token in enumerate(row) if token in eos]
            answers[i] = row[: ends[0] + 1] if ends else row
    return [answers[i] for i in range(len(prompts))]


def measure(
    prompts: int, max_new_tokens: int, rounds: int, device: str, dtype: str, model_path=None
) -> dict:
    """The embedded model's answers (``model_path``: its GGUF or converted folder, where
    the package is not installed), ``rounds`` times each way."""
    ref = TargetRef.for_user("smollm2-135m", model_path, dtype=dtype, device=device)
    target, runner = ref.load(), ref.runner()
    texts = [p.text for p in load_prompts(default_prompts_path())[:prompts]]
    ids = [target.encode_chat(text) for text in texts]
    decode_answers(runner, ids[:2], 4)  # warm-up: the engine's kernels chosen, steps made
    rows = []
    for _ in range(rounds):
        start = time.perf_counter()
        engine = decode_answers(runner, ids, max_new_tokens, GENERATION_BATCH)
        engine_s = time.perf_counter() - start
        start = time.perf_counter()
        by_generate = generated(target.model, ids, max_new_tokens)
        generate_s = time.perf_counter() - start
        rows.append(
            {
                "engine_s": round(engine_s, 2),
                "generate_s": round(generate_s, 2),
                "ratio": round(generate_s / engine_s, 2),
                "tokens": sum(map(len, engine)),
                "same_answers": sum(a == g for a, g in zip(engine, by_generate)),
            }
        )
    return {"prompts": len(ids), "max_new_tokens": max_new_tokens, "rounds": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--model-path", help="the embedded model's GGUF (a GPU check's stage)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    torch.set_grad_enabled(False)
    result = measure(
        args.prompts, args.max_new_tokens, args.rounds, args.device, args.dtype, args.model_path
    )
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    for row in result["rounds"]:
        print(
            f"{result['prompts']} answers of up to {result['max_new_tokens']} tokens: engine "
            f"{row['engine_s']:.1f} s, generate {row['generate_s']:.1f} s "
            f"({row['ratio']:.2f}x); the same answers {row['same_answers']} of "
            f"{result['prompts']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
