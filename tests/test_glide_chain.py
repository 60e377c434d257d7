"""GLIDE's greedy chain drafted in one step (``heads.glide_chain``), run eagerly on a CPU
and recorded as a CUDA graph on a GPU (where the GPU check runs this file): the same
drafts as the eager drafter's, a call a step, over the whole vocabulary and a draft
vocabulary, with their distributions for CAPE; the sequences decoded together drafted
in one run; nothing read back to the host inside it; what it refuses (a cache off the
step, a refused recording) drafted a call a step, from the commit's logits, with the
same tokens."""

# ruff: noqa: F811 (the fixtures imported from test_static_glide are redefined by name)
from __future__ import annotations

import pytest
import torch
from test_static_glide import PROMPTS, draft, runners  # noqa: F401
from test_static_step import DEVICE, NoHostReads, on_device  # noqa: F401
from test_tree_step import drafts_of, refuse_tolist

from autotune.drafters import glide as glide_drafting
from autotune.drafters.glide import GlideDrafter
from autotune.drafters.self_spec import DraftExitPolicy
from autotune.engine.batched import decode_batch
from autotune.engine.decoding import decode_plain, decode_speculative
from autotune.heads.eagle import DraftProjection
from autotune.heads.glide_chain import ChainSteps
from autotune.heads.static_glide import GlideStep

pytestmark = pytest.mark.usefixtures("one_thread", "on_device")

CHAIN = DraftExitPolicy(4, 0.0, None)  # no exit: every chain runs to its length


def tokens_and_ranked(draft) -> tuple:
    """A draft's tokens, and its ranked tokens and probabilities where it carries them."""
    ranked = None if draft.ranked_tokens is None else (draft.ranked_tokens, draft.ranked_probs)
    return list(draft.tokens), ranked


def assert_same_drafts(got: list, want: list) -> None:
    """The same tokens, ranked tokens and (to float rounding: the steps' fixed-shape
    arithmetic may round the eager draft's last bits differently) ranked probabilities."""
    assert [tokens for tokens, _ in got] == [tokens for tokens, _ in want]
    for (_, ranked), (_, their_ranked) in zip(got, want):
        assert (ranked is None) == (their_ranked is None)
        if ranked is not None:
            assert torch.equal(ranked[0], their_ranked[0])
            torch.testing.assert_close(ranked[1], their_ranked[1], rtol=1e-6, atol=1e-7)


def chains_of(draft, runner) -> ChainSteps:
    step = GlideStep.of(draft, runner.static)
    assert step is not None
    return ChainSteps.of(step, draft.vocabulary(runner)[0])


@pytest.mark.parametrize("ranked", [0, 3], ids=["tokens", "ranked for CAPE"])
def test_a_chain_is_one_step_with_the_eager_drafters_drafts(
    runners, draft, ranked, monkeypatch, same_greedy
):
    eager, fixed = runners
    vocabulary = DraftProjection(fixed.lm_head, list(range(3, 128, 2)))
    seen, proposals = drafts_of(monkeypatch, GlideDrafter, tokens_and_ranked), 0
    for projection in (None, vocabulary):
        for prompt in PROMPTS:
            seen.clear()
            drafter = GlideDrafter(draft, CHAIN, projection, ranked_width=ranked)
            alone = decode_speculative(eager, drafter, prompt, 30)
            expected = list(seen)
            seen.clear()
            drafter = GlideDrafter(draft, CHAIN, projection, ranked_width=ranked)
            result = decode_speculative(fixed, drafter, prompt, 30)
            same_greedy(fixed, prompt, result.tokens, decode_plain(eager, prompt, 30).tokens)
            assert drafter.chains is not None
            proposals += sum(len(tokens) > 1 for tokens, _ in seen)  # one token: no chain
            if DEVICE == "cpu":  # a GPU's kernels, chosen per row count, may flip a near-tie
                assert_same_drafts(seen, expected)
                assert result.accepted == alone.accepted
    assert chains_of(draft, fixed).calls == proposals > 20  # every chain in one step


def test_sequences_decoded_together_draft_their_chains_in_one_run(runners, draft, same_greedy):
    eager, fixed = runners
    prompts = [*PROMPTS[:2], [1, 22], [1, 100, 3, 3, 3, 100, 3]]
    run = decode_batch(fixed, prompts, 20, 4, lambda: GlideDrafter(draft, CHAIN))
    for prompt, result in zip(prompts, run.results, strict=True):
        same_greedy(fixed, prompt, result.tokens, decode_plain(eager, prompt, 20).tokens)
    assert chains_of(draft, fixed).batched[4] > 0


@torch.inference_mode()
def test_the_chain_step_reads_nothing_back_to_the_host(runners, draft, monkeypatch):
    fixed = runners[1]
    decode_speculative(fixed, GlideDrafter(draft, CHAIN), PROMPTS[0], 12)
    ((buffer, run),) = chains_of(draft, fixed)._steps.values()
    before = [tensor.clone() for tensor in buffer.tensors()]
    monkeypatch.setattr(torch.Tensor, "tolist", refuse_tolist)
    with NoHostReads():  # what a graph replays
        run()
    assert all(torch.equal(a, b) for a, b in zip(buffer.tensors(), before))


@torch.inference_mode()
def test_a_refused_chain_is_drafted_a_call_a_step_from_the_logits_copy(runners, draft):
    fixed = runners[1]
    drafter = GlideDrafter(draft, CHAIN)
    decode_speculative(fixed, drafter, PROMPTS[0], 8)
    assert drafter.chains is not None and drafter.cache is not None
    logits = torch.randn(128)
    drafter.cache.give_back()  # off the step: refused
    call = glide_drafting.ChainCall(drafter.cache, drafter.cache, 5, 5, logits)
    chain = glide_drafting._ChainCall(call, drafter.chains, 4)
    (refused,) = GlideDrafter.run_together(draft, drafter.projection_for(fixed), [chain])
    assert torch.equal(refused, logits) and refused.data_ptr() != logits.data_ptr()


def test_a_refused_recording_is_one_warning_and_the_same_tokens(
    runners, draft, monkeypatch, capsys, same_greedy
):
    eager, fixed = runners
    chains = chains_of(draft, fixed)
    chains.recorder.how = "graph"  # as on a GPU

    def refuse(run):
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing")

    monkeypatch.setattr(chains.recorder, "_graph", refuse)
    for prompt in PROMPTS[:2]:
        drafter = GlideDrafter(draft, CHAIN)
        tokens = decode_speculative(fixed, drafter, prompt, 30).tokens
        same_greedy(fixed, prompt, tokens, decode_plain(eager, prompt, 30).tokens)
    assert chains.recorder.failed is not None and chains.calls == 0
    said = " ".join(capsys.readouterr().err.split())
    assert said.count("warning:") == 1 and "GLIDE draft's chain" in said
