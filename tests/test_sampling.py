"""Sampling: temperature / top-p processing, and speculative sampling end to end."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from autotune.drafters.self_spec import DraftExitPolicy, LayerSkipDrafter
from autotune.engine.decoding import decode_plain, decode_speculative
from autotune.engine.runner import Runner
from autotune.engine.sampling import GREEDY, SamplingConfig, most_probable, probabilities, sample
from autotune.engine.skip import SkipMask

pytestmark = pytest.mark.usefixtures("one_thread")


# --- probabilities -------------------------------------------------------------------


def test_greedy_config():
    assert GREEDY.greedy and GREEDY.temperature == 0.0
    assert not SamplingConfig(temperature=0.7).greedy


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_temperature_scales_logits(temperature):
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    probs = probabilities(logits, SamplingConfig(temperature=temperature))
    torch.testing.assert_close(probs, torch.softmax(logits / temperature, dim=-1))
    assert float(probs.sum()) == pytest.approx(1.0)


def test_lower_temperature_is_sharper():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    cold = probabilities(logits, SamplingConfig(temperature=0.5))
    hot = probabilities(logits, SamplingConfig(temperature=2.0))
    assert cold[0] > hot[0] and cold[3] < hot[3]


def test_top_p_keeps_smallest_prefix_and_renormalises():
    target = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = target.log()[[2, 0, 3, 1]]  # shuffled: order must come from the values
    probs = probabilities(logits, SamplingConfig(temperature=1.0, top_p=0.7))
    torch.testing.assert_close(probs, torch.tensor([0.0, 0.625, 0.0, 0.375]))
    # 0.85 needs the third token too
    probs = probabilities(logits, SamplingConfig(temperature=1.0, top_p=0.85))
    torch.testing.assert_close(probs, torch.tensor([0.15, 0.5, 0.0, 0.3]) / 0.95)


@pytest.mark.parametrize("top_p", [1e-6, 0.1, 0.49])
def test_top_p_always_keeps_the_top_token(top_p):
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    probs = probabilities(logits, SamplingConfig(temperature=1.0, top_p=top_p))
    torch.testing.assert_close(probs, torch.tensor([1.0, 0.0, 0.0, 0.0]))


def test_top_p_zero_keeps_the_top_token():
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    probs = probabilities(logits, SamplingConfig(temperature=1.0, top_p=0.0))
    torch.testing.assert_close(probs, torch.tensor([1.0, 0.0, 0.0, 0.0]))


def test_top_p_works_row_wise_on_batches():
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.05, 0.15, 0.3, 0.5]]).log()
    probs = probabilities(logits, SamplingConfig(temperature=1.0, top_p=0.7))
    torch.testing.assert_close(probs, torch.tensor([[0.625, 0.375, 0, 0], [0, 0, 0.375, 0.625]]))


def test_sample_is_seeded():
    probs = torch.tensor([0.2, 0.3, 0.5])
    a = [sample(probs, torch.Generator().manual_seed(s)) for s in range(50)]
    b = [sample(probs, torch.Generator().manual_seed(s)) for s in range(50)]
    assert a == b and set(a) == {0, 1, 2}


# --- speculative sampling on a tiny model ---------------------------------------------

VOCAB = 10
PROMPT = [1, 5, 3]
SEEDS = 3000
SKIP = SkipMask.of(attention=[1])


@pytest.fixture(scope="module")
def small_vocab_llama():
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=64,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        initializer_range=0.3,
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(config).eval()


@torch.no_grad()
def exact_joint(model) -> torch.Tensor:
    """P(t1, t2 | prompt) from the model's own forward (no runner, no cache)."""
    first = torch.softmax(model(torch.tensor([PROMPT])).logits[0, -1], dim=-1)
    batch = torch.tensor([PROMPT + [t] for t in range(VOCAB)])
    second = torch.softmax(model(batch).logits[:, -1], dim=-1)
    return first[:, None] * second


@torch.no_grad()
def draft_second_marginal(runner) -> torch.Tensor:
    """P(t2) if every first draft token were output as is: what a broken acceptance rule
    would give. The test must be able to tell it from the target's."""
    cache = runner.new_cache()
    first = torch.softmax(
        runner.forward(torch.tensor(PROMPT), torch.arange(3), cache).logits[-1], -1
    )
    out = torch.zeros(VOCAB)
    for t in range(VOCAB):
        cache.crop(len(PROMPT))
        q = runner.forward(torch.tensor([t]), torch.tensor([3]), cache, skip=SKIP).logits[-1]
        out += first[t] * torch.softmax(q, -1)
    return out


def tv(p: torch.Tensor, q: torch.Tensor) -> float:
    return 0.5 * float((p - q).abs().sum())


def expected_tv_noise(p: torch.Tensor, n: int) -> float:
    """E[TV(empirical, p)] for n draws, to first order: 0.5 * sum sqrt(2 p (1 - p) / (pi n))."""
    return 0.5 * float(torch.sqrt(2 * p * (1 - p) / (math.pi * n)).sum())


def empirical_joint(decode) -> torch.Tensor:
    counts = torch.zeros(VOCAB, VOCAB)
    for seed in range(SEEDS):
        tokens = decode(SamplingConfig(temperature=1.0, seed=seed)).tokens
        counts[tokens[0], tokens[1]] += 1
    return counts / SEEDS


@pytest.mark.slow
def test_speculative_sampling_matches_target_distribution(small_vocab_llama):
    model = small_vocab_llama
    runner = Runner(model)
    assert runner.eos_token_ids == frozenset()
    joint = exact_joint(model)
    first, second = joint.sum(1), joint.sum(0)

    broken = draft_second_marginal(runner)
    noise = expected_tv_noise(second, SEEDS)
    assert tv(broken, second) > 5 * noise  # the draft really differs from the target

    drafter = LayerSkipDrafter(
        SKIP, DraftExitPolicy(max_tokens=3, exit_threshold=0.0, adaptive=None)
    )
    drafted = []

    def speculative(sampling):
        result = decode_speculative(runner, drafter, PROMPT, 5, sampling)
        drafted.append(result.draft_lengths[0])
        return result

    spec = empirical_joint(speculative)
    plain = empirical_joint(lambda sampling: decode_plain(runner, PROMPT, 2, sampling))
    assert max(drafted) == 3  # the first step drafted 3 tokens (budget allowed it)

    for name, empirical in (("speculative", spec), ("plain", plain)):
        assert tv(empirical.sum(1), first) < 3 * expected_tv_noise(first, SEEDS), name
        assert tv(empirical.sum(0), second) < 3 * expected_tv_noise(second, SEEDS), name
        assert tv(empirical.flatten(), joint.flatten()) < 2 * expected_tv_noise(
            joint.flatten(), SEEDS
        ), name
    # the two decoders agree with each other as well
    assert tv(spec.sum(0), plain.sum(0)) < 4 * noise


def test_speculative_sampling_is_reproducible(small_vocab_llama):
    runner = Runner(small_vocab_llama)
    drafter = LayerSkipDrafter(SKIP, DraftExitPolicy(3, 0.0, None))
    sampling = SamplingConfig(temperature=1.0, seed=7)
    a = decode_speculative(runner, drafter, PROMPT, 20, sampling)
    b = decode_speculative(runner, drafter, PROMPT, 20, sampling)
    assert a.tokens == b.tokens and len(a.tokens) == 20
    assert a.drafted >= a.steps and a.accepted <= a.drafted


def test_the_most_probable_token_and_its_probability_come_back_in_one_read():
    probs = torch.tensor([0.1, 0.4, 0.4, 0.1])
    assert most_probable(probs) == (pytest.approx(0.4), 1)  # a tie: the first, as argmax
    big = torch.zeros(150_001)
    big[150_000] = 1.0  # past a float16's range of exact integers, within a float32's
    assert most_probable(big) == (1.0, 150_000)
