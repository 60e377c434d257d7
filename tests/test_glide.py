"""GLIDE drafting: lossless decoding, the stale-cache measurement against the drafter it
describes, and the replay CAPE's fit and the draft-length search run on it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from autotune.drafters.cape import NO_EXPANSION, PAPER_7531, CapeDrafter, CapePolicy
from autotune.drafters.glide import GlideDrafter
from autotune.drafters.self_spec import DraftExitPolicy
from autotune.engine.decoding import decode_plain, decode_speculative
from autotune.engine.runner import Runner
from autotune.engine.sampling import SamplingConfig
from autotune.heads.eagle import DraftProjection
from autotune.measure.cape_stats import ChainSteps
from autotune.measure.costs import LatencyCurve
from autotune.measure.glide_accuracy import (
    chain_acceptance,
    chain_steps,
    chain_top1,
    draft_steps,
    glide_chain_steps,
    measure_step_seconds,
    step_accuracy,
)
from autotune.training.glide import new_draft
from autotune.tuners.cape_fit import SelfSpecChain, replay

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = [[1, 5, 9, 33, 70], [1, 100, 3, 3, 3, 100, 3], [1, 40, 41, 42, 43, 44], [1]]


@pytest.fixture
def runner(tiny_llama):
    runner = Runner(tiny_llama)
    runner.eos_token_ids = frozenset()
    return runner


@pytest.fixture
def drafts(tiny_llama):
    """Drafts warm-started from the tiny target: often right on its looping output."""
    torch.manual_seed(0)
    return {layers: new_draft(tiny_llama, layers).eval() for layers in (1, 2)}


@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("policy", [DraftExitPolicy(4, 0.0, None), DraftExitPolicy(7, 0.4, None)])
def test_greedy_decoding_is_lossless_and_drafts_are_accepted(runner, drafts, layers, policy):
    accepted = 0
    drafter = GlideDrafter(drafts[layers], policy)
    for prompt in PROMPTS:
        result = decode_speculative(runner, drafter, prompt, 40)
        assert result.tokens == decode_plain(runner, prompt, 40).tokens
        assert max(result.draft_lengths) <= policy.max_tokens
        accepted += result.accepted
    assert accepted > 10  # the chains are right often enough to exercise accepted paths


def test_draft_vocabulary_and_sampling(runner, drafts, tiny_llama):
    vocab = list(range(127, 0, -2))
    projection = DraftProjection(tiny_llama.lm_head, vocab)
    seen = []
    drafter = GlideDrafter(drafts[1], DraftExitPolicy(4, 0.0, None), projection, ranked_width=3)
    for prompt in PROMPTS:
        result = decode_speculative(
            runner, drafter, prompt, 30, on_verify=lambda d, path, logits: seen.append(d)
        )
        assert result.tokens == decode_plain(runner, prompt, 30).tokens
    assert {t for d in seen for t in d.tokens} <= set(vocab)
    assert all(set(d.ranked_tokens.flatten().tolist()) <= set(vocab) for d in seen)
    sampled = decode_speculative(
        runner, drafter, PROMPTS[1], 25, SamplingConfig(temperature=0.8, seed=3)
    )
    assert len(sampled.tokens) == 25


@pytest.mark.parametrize("layers", [1, 2])
@torch.inference_mode()
def test_the_measurement_is_what_the_drafter_drafts(runner, drafts, layers):
    """Along greedy decoding, every proposal's step confidences and ranked tokens equal
    the measurement's at that root, for the steps whose earlier tokens were right: the
    drafter's cache catch-up, stale target cache and masks are replayed exactly."""
    draft, depth = drafts[layers], 4
    prompt = PROMPTS[1]
    proposals = []
    drafter = GlideDrafter(draft, DraftExitPolicy(depth, 0.0, None), ranked_width=5)
    original = drafter.propose

    def record(context):
        out = original(context)
        proposals.append((context.position, out))
        return out

    drafter.propose = record  # type: ignore[method-assign]
    result = decode_speculative(runner, drafter, prompt, 40)
    tokens = prompt + result.tokens
    steps = draft_steps(runner, draft, tokens, len(prompt), depth)
    projection = DraftProjection(runner.lm_head)
    logits = projection(steps.hidden).float()
    checked = 0
    for position, proposal in proposals:
        row = position - len(prompt)
        for j, token in enumerate(proposal.tokens):
            probs = logits[row, j].softmax(-1)
            top = probs.topk(5)
            torch.testing.assert_close(proposal.ranked_probs[j], top.values, atol=1e-5, rtol=1e-4)
            assert proposal.ranked_tokens[j].tolist() == top.indices.tolist()
            checked += 1
            if position + j + 1 >= len(tokens) or token != tokens[position + j + 1]:
                break  # later steps read a wrong token: not what the measurement drafts
    assert checked > len(proposals)  # deeper steps were compared too


def test_steps_past_the_end_have_no_rank_and_accuracy_counts_what_exists(runner, drafts):
    tokens = PROMPTS[0] + decode_plain(runner, PROMPTS[0], 10).tokens
    steps = draft_steps(runner, drafts[1], tokens, len(PROMPTS[0]), 3)
    assert steps.hidden.shape[:2] == (len(tokens) - 1 - len(PROMPTS[0]), 3)
    assert steps.truth[-1].tolist() == [tokens[-1], -1, -1]
    ranks, confidence = steps.ranks(DraftProjection(runner.lm_head))
    assert (ranks[-1, 1:] == -1).all() and (confidence > 0).all()
    accuracy = step_accuracy([steps], DraftProjection(runner.lm_head), max_rank=5)
    assert accuracy.positions == [9, 8, 7]


def chains_for(runner, draft, max_new_tokens):
    calibration = [(p, decode_plain(runner, p, max_new_tokens).tokens) for p in PROMPTS]
    projection = DraftProjection(runner.lm_head)
    return calibration, glide_chain_steps(runner, draft, calibration, 8, {0: projection})[0]


@pytest.mark.parametrize(
    "policy,cape",
    [
        (DraftExitPolicy(4, 0.0, None), None),
        (DraftExitPolicy(6, 0.5, None), None),
        (DraftExitPolicy(3, 0.0, None), PAPER_7531),
        (DraftExitPolicy(5, 0.3, None), CapePolicy((0.5, 1.0), (3, 1), 8)),
    ],
)
def test_the_replay_takes_as_many_steps_as_decoding(runner, drafts, policy, cape):
    """CAPE's fit and the draft-length search replay decoding on the measured chains:
    for greedy decoding they must take exactly the steps real decoding takes."""
    calibration, chains = chains_for(runner, drafts[2], 30)
    curve = LatencyCurve([1.0] * 40)
    rule = SelfSpecChain(policy, 0.1)
    predicted = replay(chains, rule, cape or NO_EXPANSION, curve)
    tokens = steps = 0
    for prompt, continuation in calibration:
        drafter = GlideDrafter(drafts[2], policy, ranked_width=8 if cape else 0)
        result = decode_speculative(
            runner, CapeDrafter(drafter, cape) if cape else drafter, prompt, 30
        )
        assert result.tokens == continuation
        tokens, steps = tokens + len(result.tokens) - 1, steps + result.steps
    assert predicted.tokens_per_step == pytest.approx(tokens / steps)
    assert tokens / steps > 1.2  # the chains are often right


def test_chain_statistics_on_a_hand_made_chain():
    ranks = np.array([[-1, -1, -1], [0, 0, 1], [0, 2, -1], [1, 0, -1], [0, -1, -1]])
    chains = [ChainSteps(np.full(ranks.shape, 0.5), ranks)]
    # step 0 over roots 1..4; step 1 over roots 1..3; step 2 over roots 1..2
    assert chain_top1(chains) == pytest.approx([3 / 4, 2 / 3, 0 / 2])
    # whole chains of 3 exist from roots 1..2: (0,0,1) and (0,2,-)
    assert chain_acceptance(chains) == pytest.approx([2 / 2, 1 / 2, 0 / 2])


def test_chain_steps_row_zero_is_never_drafted(runner, drafts):
    tokens = PROMPTS[2] + decode_plain(runner, PROMPTS[2], 12).tokens
    steps = draft_steps(runner, drafts[1], tokens, len(PROMPTS[2]), 2)
    chain = chain_steps(steps, DraftProjection(runner.lm_head))
    assert chain.roots == 12 and (chain.ranks[0] == -1).all()
    assert not chain.reached()[0].any()


def test_step_cost_is_measured(runner, drafts):
    assert 0 < measure_step_seconds(runner, drafts[1], context=32, repeats=2) < 5
