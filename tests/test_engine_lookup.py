"""The serving engines' own prompt-lookup rules (``drafters.engine_lookup``): transformers'
checked against its own candidate generator, llama.cpp's against its rule step by step,
and all of them lossless and replayed exactly."""

from __future__ import annotations

import random

import pytest
import torch

from autotune.drafters.engine_lookup import EngineLookupConfig
from autotune.drafters.ngram import NgramDrafter
from autotune.engine.decoding import decode_plain, decode_speculative
from autotune.methods.ngram.replay import Continuation, replay


def drafts(config: EngineLookupConfig, history: list[int], max_tokens: int = 1000) -> list[int]:
    return NgramDrafter(config).draft_for(history, max_tokens).tokens


def sequences(count: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    """Random sequences from a small vocabulary with copied spans: many matches."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        seq = [rng.randrange(vocab) for _ in range(8)]
        while len(seq) < length:
            if rng.random() < 0.5 and len(seq) > 4:
                start = rng.randrange(len(seq) - 3)
                seq += seq[start : start + rng.randrange(2, 7)]
            else:
                seq.append(rng.randrange(vocab))
        out.append(seq[:length])
    return out


@pytest.mark.parametrize("max_match,tokens", [(2, 10), (3, 4), (1, 6)])
def test_hf_rule_drafts_what_transformers_prompt_lookup_drafts(max_match, tokens):
    from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

    generator = PromptLookupCandidateGenerator(
        eos_token_id=torch.tensor([-1]),  # none: 4.x tests the candidates for it unasked
        num_output_tokens=tokens,
        max_matching_ngram_size=max_match,
        max_length=10_000,
    )
    config = EngineLookupConfig("hf", 1, max_match, tokens)
    compared = drafted = 0
    for seq in sequences(12, 60, vocab=7):
        for cut in range(3, len(seq) + 1):
            history = seq[:cut]
            ids = torch.tensor([history])
            candidates, _ = generator.get_candidates(ids)
            theirs = candidates[0, len(history) :].tolist()
            assert drafts(config, history) == theirs, history
            compared += 1
            drafted += bool(theirs)
    assert drafted > compared // 2  # the sequences really exercised the matching


def llamacpp_reference(history: list[int], n: int, m: int) -> list[int]:
    """llama.cpp's ngram-simple restated over positions: ``tokens`` is the history
    without its last (sampled) token."""
    tokens, sampled = history[:-1], history[-1]
    size = len(tokens)
    if size <= n + m + 1:
        return []
    pattern = tokens[size - n + 1 :] + [sampled]
    for start in range(size - n - 1, 0, -1):
        if tokens[start : start + n] == pattern:
            copy = min(m, size - (start + n))
            return tokens[start + n : start + n + copy] if copy >= n else []
    return []


@pytest.mark.parametrize("n,m", [(2, 6), (3, 8), (1, 3)])
def test_llamacpp_rule_follows_ngram_simple(n, m):
    config = EngineLookupConfig("llamacpp", n, n, m)
    drafted = 0
    for seq in sequences(12, 60, vocab=6, seed=1):
        for cut in range(2, len(seq) + 1):
            history = seq[:cut]
            expected = llamacpp_reference(history, n, m)
            assert drafts(config, history) == expected, history
            drafted += bool(expected)
    assert drafted > 50


def test_vllm_rule_takes_the_earliest_of_the_longest_matches_and_stops_at_the_end():
    config = EngineLookupConfig("vllm", 2, 3, 4)
    #        0  1  2  3  4  5  6  7  8  9 10
    seq = [5, 1, 2, 3, 7, 9, 1, 2, 3, 8, 1, 2, 3]
    assert drafts(config, seq) == [7, 9, 1, 2]  # "1 2 3" at 1-3 before 6-8
    assert drafts(EngineLookupConfig("vllm", 4, 4, 4), seq) == []  # no 4-token match
    assert drafts(config, [4, 1, 2, 1, 2]) == [1, 2]  # the copy ends where the text does


def test_rules_fix_the_options_their_engine_lacks_and_never_guess():
    assert EngineLookupConfig("hf", 3, 4, 5).min_match == 1
    assert EngineLookupConfig("llamacpp", 1, 4, 5, "first") == EngineLookupConfig(
        "llamacpp", 4, 4, 5, "recent"
    )
    assert EngineLookupConfig("trtllm", 2, 3, 4, "recent").prefer == "recent"
    with pytest.raises(ValueError):
        EngineLookupConfig("sglang", 1, 2, 3)  # type: ignore[arg-type]
    assert drafts(EngineLookupConfig("vllm", 1, 2, 4), [1, 2, 3]) == []


@pytest.mark.parametrize("engine", ["hf", "vllm", "trtllm", "llamacpp"])
def test_engine_rules_decode_losslessly_and_replay_exactly(tiny_llama_dir, engine):
    from autotune.models.ref import TargetRef

    runner = TargetRef.for_user(str(tiny_llama_dir)).runner()
    runner.eos_token_ids = frozenset()
    config = EngineLookupConfig(engine, 1, 2, 4)
    accepted = 0
    for prompt in ([1, 5, 9, 5, 9, 5, 9, 33, 5, 9], [1, 40, 41, 42, 40, 41, 42, 40], [1, 7]):
        plain = decode_plain(runner, prompt, 30).tokens
        real = decode_speculative(runner, NgramDrafter(config), prompt, 30)
        assert real.tokens == plain
        sizes = replay(NgramDrafter(config), Continuation(tuple(prompt), tuple(plain), 30))
        assert sizes == real.draft_lengths
        assert 0 in real.draft_lengths  # steps with no match draft nothing
        accepted += real.accepted
    assert accepted > 0
