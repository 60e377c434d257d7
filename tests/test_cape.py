"""CAPE expansion on the autoregressive drafters: tree shape, budget, losslessness."""

from __future__ import annotations

import pytest
import torch

from autotune.drafters.cape import NO_EXPANSION, PAPER_7531, CapeDrafter, CapePolicy
from autotune.drafters.eagle import EagleDrafter, StaticTree
from autotune.drafters.self_spec import DraftExitPolicy, LayerSkipDrafter
from autotune.engine.decoding import decode_plain, decode_speculative
from autotune.engine.runner import Runner
from autotune.engine.sampling import SamplingConfig
from autotune.engine.skip import SkipMask

PROMPTS = [[1, 5, 9, 13, 40, 41], [1, 70, 3, 3, 3, 90, 12, 8, 77]]
WIDE = CapePolicy((0.5, 1.0), (4, 2), max_verify_tokens=9)
RANKED = 8  # ranked tokens the chain drafters report: enough for every policy here


def drafters(model, make_head):
    yield (
        "self_spec",
        lambda: LayerSkipDrafter(SkipMask.of([1, 2], [2]), DraftExitPolicy(4, 0.0, None), RANKED),
    )
    head = make_head(model)
    yield (
        "eagle",
        lambda: EagleDrafter(head, StaticTree(((0,), (0, 0), (0, 0, 0))), ranked_width=RANKED),
    )


def test_cape_refuses_a_base_that_reports_too_few_ranks(tiny_llama):
    base = LayerSkipDrafter(SkipMask.of([1]), DraftExitPolicy(4, 0.0, None), ranked_width=3)
    with pytest.raises(ValueError, match="ranked_width"):
        CapeDrafter(base, PAPER_7531)


def test_policy_bins():
    assert [PAPER_7531.tokens_at(p) for p in (0.05, 0.3, 0.31, 0.6, 0.7, 0.8, 0.95, 1.0)] == [
        7,
        7,
        5,
        5,
        3,
        3,
        1,
        1,
    ]
    with pytest.raises(ValueError, match=r"ascend to 1.0"):
        CapePolicy((0.5, 0.9), (2, 1))
    with pytest.raises(ValueError, match="one expansion size per"):
        CapePolicy((1.0,), (2, 1))


@pytest.mark.parametrize("policy", [NO_EXPANSION, PAPER_7531, WIDE], ids=["none", "7531", "wide"])
def test_greedy_cape_decoding_is_lossless_for_both_drafters(
    tiny_llama, one_thread, policy, random_eagle_head
):
    runner = Runner(tiny_llama)
    for name, make in drafters(tiny_llama, random_eagle_head):
        for prompt in PROMPTS:
            drafts = []
            result = decode_speculative(
                runner,
                CapeDrafter(make(), policy),
                prompt,
                30,
                on_verify=lambda d, path, logits: drafts.append(d),
            )
            assert result.tokens == decode_plain(runner, prompt, 30).tokens, name
            for draft in drafts:
                assert len(draft.tokens) + 1 <= policy.max_verify_tokens
                if policy is NO_EXPANSION:
                    assert draft.tree.is_chain


@torch.inference_mode()
def test_siblings_are_the_runner_up_tokens_at_their_depth(
    tiny_llama, one_thread, random_eagle_head
):
    """Step i's chain token and its k_i - 1 runner-ups hang below chain node i - 1, k_i
    from the bin of that step's top-1 probability; siblings are never extended."""
    runner = Runner(tiny_llama)
    for name, make in drafters(tiny_llama, random_eagle_head):
        base = make()
        cape = CapeDrafter(base, WIDE)
        pairs = []
        propose = base.propose

        def spy(context):
            draft = propose(context)
            pairs.append(draft)
            return draft

        base.propose = spy
        decode_speculative(
            runner, cape, PROMPTS[1], 20, on_verify=lambda d, path, logits: pairs.append(d)
        )
        for chain_draft, tree_draft in zip(pairs[::2], pairs[1::2]):
            tree, tokens = tree_draft.tree, tree_draft.tokens
            chain_node = -1
            for step, token in enumerate(chain_draft.tokens):
                below = [n for n, p in enumerate(tree.parents) if p == chain_node]
                k = WIDE.tokens_at(float(chain_draft.ranked_probs[step, 0]))
                expected = [token] + [
                    t for t in chain_draft.ranked_tokens[step].tolist() if t != token
                ][: k - 1]
                assert [tokens[n] for n in below] == expected[: len(below)], name
                chain_node = below[0]
            assert tree.size <= WIDE.max_verify_tokens - 1
            leaves = set(range(tree.size)) - set(tree.parents)
            assert len(set(range(tree.size)) - leaves) <= len(chain_draft.tokens)
        assert any(not d.tree.is_chain for d in pairs[1::2])  # siblings were added


def test_sampled_cape_decoding_runs(tiny_llama, one_thread, random_eagle_head):
    runner = Runner(tiny_llama)
    for _name, make in drafters(tiny_llama, random_eagle_head):
        result = decode_speculative(
            runner,
            CapeDrafter(make(), PAPER_7531),
            PROMPTS[0],
            20,
            SamplingConfig(temperature=0.8, seed=1),
        )
        assert len(result.tokens) == 20 or result.tokens[-1] in runner.eos_token_ids


def test_confidence_ranks_bin_and_normalise():
    from autotune.measure.cape_stats import ConfidenceRanks

    stats = ConfidenceRanks.collect(
        [0.05, 0.1, 0.12, 0.55, 0.99, 1.0], [0, 3, -1, 1, 0, 12], bins=10, max_rank=4
    )
    assert stats.steps(0.0, 0.1) == 2 and stats.steps(0.1, 0.2) == 1
    assert stats.rank_distribution(0.0, 0.2).tolist() == [1 / 3, 0, 0, 1 / 3, 1 / 3]
    assert stats.rank_distribution(0.9, 1.0).tolist() == [0.5, 0, 0, 0, 0.5]  # 12: past 4
    again = ConfidenceRanks.from_dict(stats.as_dict())
    assert (again.merged(stats).counts == 2 * stats.counts).all()


@torch.inference_mode()
def test_self_spec_traces_rank_the_target_token(tiny_llama, one_thread):
    from autotune.measure.cape_stats import self_spec_confidence_ranks
    from autotune.measure.draft_trace import DraftTracer

    runner = Runner(tiny_llama)
    calibration = [(p, decode_plain(runner, p, 16).tokens) for p in PROMPTS]
    traces = DraftTracer(runner, calibration).traces(SkipMask.of([1, 2], [2]))
    for trace in traces:
        assert ((trace.ranks == 0) == trace.matches).all()
    stats = self_spec_confidence_ranks(traces)
    assert stats.steps(0.0, 1.0) == sum(len(t.ranks) for t in traces)


@torch.inference_mode()
def test_eagle_statistics_count_the_steps_a_chain_reaches(
    tiny_llama, one_thread, random_eagle_head
):
    from autotune.measure.cape_stats import chain_confidence_ranks, eagle_chain_steps
    from autotune.measure.eagle_accuracy import extrapolation_ranks

    runner = Runner(tiny_llama)
    head = random_eagle_head(tiny_llama, std=0.05)
    calibration = [(p, decode_plain(runner, p, 16).tokens) for p in PROMPTS]
    stats = chain_confidence_ranks(eagle_chain_steps(runner, head, calibration, depth=3))
    reached, right = 0, 0
    for prompt, continuation in calibration:  # one root and one step at a time
        tokens = prompt + continuation
        out = runner.forward(
            torch.tensor(tokens[:-1]), torch.arange(len(tokens) - 1), runner.new_cache(64)
        )
        ranks = extrapolation_ranks(
            head, runner, runner.norm(out.hidden), tokens, len(prompt) - 1, 3
        ).tolist()
        for i, row in enumerate(ranks):
            root = len(prompt) - 1 + i
            for step in range(3):
                if root + step + 2 >= len(tokens):  # no true token this deep
                    break
                reached += 1
                right += row[step] == 0
                if row[step] != 0:  # the chain went wrong here
                    break
    assert stats.steps(0.0, 1.0) == reached and stats.counts[:, 0].sum() == right
    assert right > 0


@torch.inference_mode()
def test_replay_predicts_eagle_cape_decoding_step_for_step(
    tiny_llama, one_thread, random_eagle_head
):
    """The fit's replay of a chain drafter with expansion takes exactly as many steps as
    decoding does (EAGLE's chain steps are exact; the budget binds in WIDE)."""
    from autotune.measure.cape_stats import eagle_chain_steps
    from autotune.measure.costs import LatencyCurve
    from autotune.tuners.cape_fit import FixedChain, replay

    runner = Runner(tiny_llama)
    head = random_eagle_head(tiny_llama, std=0.05)
    tree = StaticTree(((0,), (0, 0), (0, 0, 0)))
    flat = LatencyCurve([1.0] * 40)
    steps_by_policy = {}
    for policy in (NO_EXPANSION, WIDE, PAPER_7531):
        for prompt in PROMPTS:
            continuation = decode_plain(runner, prompt, 40).tokens
            chains = eagle_chain_steps(runner, head, [(prompt, continuation)], depth=3)
            result = decode_speculative(
                runner,
                CapeDrafter(EagleDrafter(head, tree, ranked_width=RANKED), policy),
                prompt,
                len(continuation),
            )
            estimate = replay(chains, FixedChain(3, 0.0), policy, flat)
            steps = round((len(continuation) - 1) / estimate.tokens_per_step)
            assert steps == result.steps, (policy, prompt)
            assert result.tokens == continuation
            steps_by_policy.setdefault(policy, []).append(steps)
    assert steps_by_policy[WIDE] != steps_by_policy[NO_EXPANSION]  # siblings were accepted


def test_fit_expands_where_siblings_pay_and_not_where_verification_is_dear():
    """On made-up chains whose runner-up is right whenever the draft is unsure: with flat
    verification the fit expands the unsure bin; with dear verification it does not."""
    import numpy as np

    from autotune.measure.cape_stats import ChainSteps
    from autotune.measure.costs import LatencyCurve
    from autotune.tuners.cape_fit import FitSettings, FixedChain, fit_expansion, replay

    rng = np.random.default_rng(0)
    roots = 400
    unsure = rng.random((roots, 1)) < 0.5
    confidences = np.where(unsure, 0.2, 0.95)
    ranks = np.where(unsure, 1, 0)  # unsure: the target's token is rank 1
    chains = [ChainSteps(confidences, ranks)]
    space = FitSettings(fine_bins=10, max_expansion=4, max_verify_tokens=32, min_gain=0.002)
    cheap = fit_expansion(chains, FixedChain(1, 0.1), LatencyCurve([1.0] * 40), space)
    assert cheap.policy.tokens_at(0.2) >= 2 and cheap.policy.tokens_at(0.95) == 1
    assert cheap.predicted.speedup > cheap.no_expansion.speedup
    assert cheap.predicted == replay(
        chains, FixedChain(1, 0.1), cheap.policy, LatencyCurve([1.0] * 40)
    )
    dear = fit_expansion(
        chains, FixedChain(1, 0.1), LatencyCurve([1.0 + 2.0 * n for n in range(40)]), space
    )
    assert dear.policy == NO_EXPANSION.__class__((1.0,), (1,), space.max_verify_tokens)


def test_variants_are_measured_against_one_plain_decoding_per_prompt(
    tiny_llama, one_thread, random_eagle_head
):
    """The CAPE benchmark's measurement: every variant shares each prompt's plain run,
    and each variant's own output is checked against it."""
    from autotune.measure.timing import EncodedPrompt, measure_variants

    runner = Runner(tiny_llama)
    make = dict(drafters(tiny_llama, random_eagle_head))["eagle"]
    makers = {
        "none": lambda: CapeDrafter(make(), NO_EXPANSION),
        "wide": lambda: CapeDrafter(make(), WIDE),
    }
    prompts = [EncodedPrompt(str(i), p) for i, p in enumerate(PROMPTS * 2)]
    measured = measure_variants(runner, makers, prompts, 12)
    assert set(measured) == {"none", "wide"}
    for a, b in zip(measured["none"].prompts, measured["wide"].prompts):
        assert a.baseline_seconds == b.baseline_seconds and a.prompt_id == b.prompt_id
        assert a.lossless and b.lossless
    assert measured["wide"].tokens_per_step >= measured["none"].tokens_per_step
