"""Plain greedy decoding by autotune's runner against transformers' own `generate`, on the
embedded model: the same tokens, or a divergence only where the two best logits were within
a rounding error of each other (a near-tie, which a different summation order may flip)."""

from __future__ import annotations

import pytest
import torch

from autotune.engine.decoding import decode_plain
from autotune.engine.runner import Runner
from autotune.prompts import default_prompts_path, load_prompts, split_prompts

NEAR_TIE = 1e-3  # logits this close: float32 kernels summing in another order can flip them
TOKENS = 48


def hf_greedy(model, ids: list[int], tokens: int, eos: frozenset[int]) -> list[int]:
    out = model.generate(
        torch.tensor([ids]), max_new_tokens=tokens, do_sample=False, pad_token_id=0
    )[0, len(ids) :].tolist()
    for i, token in enumerate(out):
        if token in eos:
            return out[: i + 1]
    return out


@pytest.mark.embedded
def test_plain_greedy_equals_transformers_generate_but_at_near_ties(embedded_target, one_thread):
    target, model = embedded_target, embedded_target.model
    runner = Runner(model)
    held = split_prompts(load_prompts(default_prompts_path()))[1][:6]
    for prompt in held:
        ids = target.encode_chat(prompt.text)
        ours = decode_plain(runner, ids, TOKENS).tokens
        theirs = hf_greedy(model, ids, TOKENS, runner.eos_token_ids)
        if ours == theirs:
            continue
        first = next(i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b)
        with torch.no_grad():
            logits = model(torch.tensor([ids + theirs[:first]])).logits[0, -1].float()
        best, second = logits.topk(2).values.tolist()
        assert best - second < NEAR_TIE, (prompt.id, first, best - second)
        assert {ours[first], theirs[first]} == set(logits.topk(2).indices.tolist())
