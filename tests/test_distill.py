"""The shared self-distillation set: answers decoded once, kept by fingerprint and prompts,
and read back by the next trainer with the same hidden states."""

from __future__ import annotations

import pytest
import torch

from autotune.training import distill
from autotune.training.distill import AnswerCache, answer_prompts, greedy_answers, teacher_forced

pytestmark = pytest.mark.usefixtures("one_thread")

TEXTS = ["Hi.", "Write a poem about rain, please.", "What is 2+2?", "Name a colour."]


def test_teacher_forced_states_are_the_decoding_states_whatever_the_batch(tiny_target):
    model = tiny_target.model
    prompts = [tiny_target.encode_chat(t) for t in TEXTS]
    decoded = greedy_answers(model, prompts, max_new_tokens=12, batch_size=1, prefill=True)
    forced = teacher_forced(model, prompts, [a.tokens for a in decoded], batch_size=3, prefill=True)
    for got, want in zip(forced, decoded):
        assert got.tokens == want.tokens
        with torch.inference_mode():  # the base head turns each state into its token
            assert model.lm_head(got.hidden).argmax(-1).tolist() == got.tokens
        torch.testing.assert_close(got.hidden, want.hidden, atol=1e-4, rtol=1e-4)
        assert got.prefill is not None and want.prefill is not None
        torch.testing.assert_close(got.prefill, want.prefill, atol=1e-4, rtol=1e-4)


def test_a_second_trainer_reads_the_answers_back_instead_of_decoding(
    tiny_target, tmp_path, monkeypatch
):
    prompts = [tiny_target.encode_chat(t) for t in TEXTS]
    cache = AnswerCache(tmp_path, tiny_target.fingerprint)
    first, _ = answer_prompts(tiny_target, prompts[:3], prompts[3:], 16, 2, cache=cache)
    assert len(list(tmp_path.glob("*.json"))) == 1

    def no_decoding(*args, **kwargs):
        raise AssertionError("decoded again")

    monkeypatch.setattr(distill, "decode_answers", no_decoding)
    again, _ = answer_prompts(tiny_target, prompts[:3], prompts[3:], 16, 2, cache=cache)
    assert [a.tokens for _, a in again] == [a.tokens for _, a in first]
    # a shorter answer length is a prefix of the kept one: still no decoding
    short, _ = answer_prompts(tiny_target, prompts[:3], prompts[3:], 5, 2, cache=cache)
    assert [a.tokens for _, a in short] == [a.tokens[:5] for _, a in first]
    assert all(len(a.hidden) == len(a.tokens) for _, a in short)
    # a longer one is not kept: it is decoded
    with pytest.raises(AssertionError, match="decoded again"):
        answer_prompts(tiny_target, prompts[:3], prompts[3:], 32, 2, cache=cache)


def test_a_damaged_cache_file_is_decoded_again(tiny_target, tmp_path):
    prompts = [tiny_target.encode_chat(t) for t in TEXTS[:2]]
    cache = AnswerCache(tmp_path, tiny_target.fingerprint)
    answer_prompts(tiny_target, prompts[:1], prompts[1:], 8, 2, cache=cache)
    (file,) = tmp_path.glob("*.json")
    file.write_text("{not json")
    assert cache.load(prompts, 8) == [None, None]
    train, _ = answer_prompts(tiny_target, prompts[:1], prompts[1:], 8, 2, cache=cache)
    assert train[0][1].tokens and None not in cache.load(prompts, 8)


def test_only_the_prompts_the_cache_lacks_are_decoded(tiny_target, tmp_path, monkeypatch):
    prompts = [tiny_target.encode_chat(t) for t in TEXTS]
    cache = AnswerCache(tmp_path, tiny_target.fingerprint)
    answer_prompts(tiny_target, prompts[:2], [], 10, 2, cache=cache)
    decoded = []
    real = distill.decode_answers

    def counting(runner, asked, *args, **kwargs):
        decoded.extend(asked)
        return real(runner, asked, *args, **kwargs)

    monkeypatch.setattr(distill, "decode_answers", counting)
    train, _ = answer_prompts(tiny_target, prompts, [], 10, 2, cache=cache)
    assert decoded == prompts[2:]
    alone = greedy_answers(tiny_target.model, prompts, 10, batch_size=1)
    assert [a.tokens for _, a in train] == [a.tokens for a in alone]


def test_the_states_of_kept_answers_are_computed_once_per_process(tiny_target, monkeypatch):
    model = tiny_target.model
    prompts = [tiny_target.encode_chat(t) for t in TEXTS]
    answers = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [14, 15]]
    calls = []
    real = distill.teacher_forced
    monkeypatch.setattr(
        distill, "teacher_forced", lambda *args: calls.append(args[-1]) or real(*args)
    )
    eagle = distill.kept_states(model, prompts, answers, 2, prefill=True)
    again = distill.kept_states(model, prompts, answers, 2, prefill=True)
    medusa = distill.kept_states(model, prompts, answers, 2, prefill=False)
    assert calls == [True]  # one forward pass for all three
    assert again is eagle and all(a.prefill is not None for a in eagle)
    assert all(a.prefill is None for a in medusa)  # asked for none, given none
    torch.testing.assert_close(medusa[1].hidden, eagle[1].hidden)
    distill.kept_states(model, prompts, [a[:1] for a in answers], 2, prefill=False)
    assert calls == [True, False]  # other answers: computed
