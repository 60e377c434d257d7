"""The drafter contract (``autotune.engine.proposal.Drafter``), run over every drafter of
every registered method, each of its example settings, with and without CAPE for the
chain methods, on a tiny random LLaMA:

- every proposal is at least one token, a valid tree, within the drafter's limit;
- greedy decoding with it equals plain greedy decoding, token for token;
- it still does so when ``observe`` is told, every step, that all of the draft or none
  of it was accepted;
- a one-token prompt; an end-of-sequence token inside an accepted draft; exactly
  ``max_new_tokens`` tokens.

A new method joins by registering: ``Method.examples`` is abstract, so a method cannot
register without the settings this suite runs it on."""

from __future__ import annotations

import pytest
import torch

from autotune.engine.batched import Prefills, decode_batch
from autotune.engine.decoding import decode_plain, decode_speculative
from autotune.engine.proposal import Draft, DraftContext, Drafter, VerifyResult
from autotune.methods import registry
from autotune.methods.base import DraftEnv
from autotune.methods.cape.settings import CapeSettings
from autotune.models.ref import TargetRef

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = [[1, 5, 9, 33, 70], [1, 100, 3, 3, 3, 100, 3], [1, 40, 41, 42, 43, 44]]
TOKENS = 24
CAPE = CapeSettings(bins=[0.3, 0.6, 0.8, 1.0], expansion=[7, 5, 3, 1], max_verify_tokens=12)


def cases() -> list:
    out = []
    for name, method in registry.methods().items():
        out.append(pytest.param(name, False, id=name))
        if method.chain:
            out.append(pytest.param(name, True, id=f"{name}+cape"))
    return out


@pytest.fixture
def env(tiny_llama_dir):
    ref = TargetRef.for_user(str(tiny_llama_dir))
    runner = ref.runner()
    runner.eos_token_ids = frozenset()  # full-length outputs unless a test sets one
    return DraftEnv(ref, runner)


def makers(env: DraftEnv, name: str, cape: bool, folder):
    """(example name, drafter factory) for each example setting of the method."""
    method = registry.get(name)
    for label, settings in method.examples(env.runner.model, folder).items():
        if cape:
            settings = settings.model_copy(
                update={"cape": CAPE.model_copy(update={"chain_depth": 3})}
            )
        yield label, method.deployed_drafter(settings, env)


class Recorder(Drafter):
    """Passes everything to ``inner``; keeps its drafts; and, when ``claim`` says so,
    tells it that all (``"all"``) or none (``"none"``) of each draft was accepted."""

    def __init__(self, inner: Drafter, claim: str | None = None):
        self.inner, self.claim = inner, claim
        self.drafts: list[Draft] = []
        self.max_draft_tokens = inner.max_draft_tokens
        self.may_skip = inner.may_skip

    def reset(self) -> None:
        self.inner.reset()

    def extra_rows(self, runner):
        return self.inner.extra_rows(runner)

    def propose(self, context: DraftContext) -> Draft:
        draft = self.inner.propose(context)
        self.drafts.append(draft)
        return draft

    def observe(self, result: VerifyResult) -> None:
        if self.claim is None:
            self.inner.observe(result)
            return
        draft = self.drafts[-1]
        if self.claim == "none":
            self.inner.observe(VerifyResult(len(draft.tokens), 0, ()))
            return
        path, node = [], -1  # the deepest path, first children first
        children = draft.shape.children
        while children[node + 1]:
            node = children[node + 1][0]
            path.append(node)
        self.inner.observe(VerifyResult(len(draft.tokens), len(path), tuple(path)))


def check_drafts(recorder: Recorder, vocab: int) -> None:
    assert recorder.drafts, "no proposal was made"
    for draft in recorder.drafts:
        assert len(draft.tokens) >= (0 if recorder.may_skip else 1)
        assert len(draft.tokens) <= recorder.max_draft_tokens
        shape = draft.shape  # TreeShape checks parents come first
        assert shape.size == len(draft.tokens)
        assert all(0 <= t < vocab for t in draft.tokens)
        if draft.tree is not None:
            # siblings hold distinct tokens: a repeated one could never be accepted twice
            for children in shape.children:
                tokens = [draft.tokens[c] for c in children]
                assert len(tokens) == len(set(tokens))


@pytest.mark.parametrize("name,cape", cases())
def test_proposals_are_valid_and_greedy_output_is_plain_greedy(
    env, tmp_path, name, cape, same_greedy
):
    vocab = env.runner.config.vocab_size
    for label, make in makers(env, name, cape, tmp_path):
        drafter = Recorder(make())
        for prompt in PROMPTS:
            plain = decode_plain(env.runner, prompt, TOKENS).tokens
            result = decode_speculative(env.runner, drafter, prompt, TOKENS)
            same_greedy(env.runner, prompt, result.tokens, plain, label)
        check_drafts(drafter, vocab)


@pytest.mark.parametrize("claim", ["all", "none"])
@pytest.mark.parametrize("name,cape", cases())
def test_observe_of_full_and_zero_acceptance(env, tmp_path, name, cape, claim, same_greedy):
    for label, make in makers(env, name, cape, tmp_path):
        drafter = Recorder(make(), claim)
        for prompt in PROMPTS[:2]:
            plain = decode_plain(env.runner, prompt, TOKENS).tokens
            got = decode_speculative(env.runner, drafter, prompt, TOKENS).tokens
            same_greedy(env.runner, prompt, got, plain, label)
        check_drafts(drafter, env.runner.config.vocab_size)


@pytest.mark.parametrize("name,cape", cases())
def test_one_token_prompt_and_exact_lengths(env, tmp_path, name, cape):
    for label, make in makers(env, name, cape, tmp_path):
        drafter = make()
        plain = decode_plain(env.runner, [1], TOKENS).tokens
        assert decode_speculative(env.runner, drafter, [1], TOKENS).tokens == plain, label
        for n in (1, 2, 3, 7):
            out = decode_speculative(env.runner, drafter, PROMPTS[0], n).tokens
            assert len(out) == n, (label, n)
            assert out == decode_plain(env.runner, PROMPTS[0], n).tokens


@pytest.mark.parametrize("name,cape", cases())
def test_end_of_sequence_inside_a_draft_ends_the_output_there(env, tmp_path, name, cape):
    runner = env.runner
    free = {tuple(p): decode_plain(runner, p, TOKENS).tokens for p in PROMPTS}
    for label, make in makers(env, name, cape, tmp_path):
        drafter = make()
        for prompt in PROMPTS:
            tokens = free[tuple(prompt)]
            for eos in {tokens[4], tokens[11], tokens[-1]}:
                runner.eos_token_ids = frozenset({eos})
                plain = decode_plain(runner, prompt, TOKENS).tokens
                assert plain[-1] == eos and plain.count(eos) == 1
                assert decode_speculative(runner, drafter, prompt, TOKENS).tokens == plain, (
                    label,
                    eos,
                )
        runner.eos_token_ids = frozenset()


@torch.inference_mode()
def test_sampled_decoding_runs_with_every_drafter(env, tmp_path):
    from autotune.engine.sampling import SamplingConfig

    for name in registry.methods():
        for label, make in makers(env, name, False, tmp_path):
            result = decode_speculative(
                env.runner, make(), PROMPTS[0], 12, SamplingConfig(temperature=0.8, seed=1)
            )
            assert len(result.tokens) == 12, (name, label)


@pytest.mark.parametrize("name,cape", cases())
def test_batched_greedy_output_is_each_prompts_plain_greedy(env, tmp_path, name, cape):
    """Several requests in flight, each with its own drafter, all drafts verified in one
    forward (``engine.batched``): each output is still its prompt's plain greedy output,
    also when an end-of-sequence token stops one request early."""
    runner = env.runner
    prompts = [*PROMPTS, [1, 7], PROMPTS[1]]
    plain = [decode_plain(runner, p, TOKENS).tokens for p in prompts]
    for label, make in makers(env, name, cape, tmp_path):
        prefills = Prefills()  # the second level starts from the first one's prefills
        for concurrency in (2, 4):
            run = decode_batch(runner, prompts, TOKENS, concurrency, make, prefills)
            assert [r.tokens for r in run.results] == plain, (label, concurrency)
        runner.eos_token_ids = frozenset({plain[0][6]})
        try:
            ended = [decode_plain(runner, p, TOKENS).tokens for p in prompts]
            run = decode_batch(runner, prompts, TOKENS, 3, make)
            assert [r.tokens for r in run.results] == ended, label
        finally:
            runner.eos_token_ids = frozenset()


@pytest.mark.parametrize("name,cape", cases())
def test_load_candidates_draft_within_their_cap_and_stay_lossless(env, tmp_path, name, cape):
    """The smaller settings a level under load may choose (``Method.load_settings``):
    each drafts no more than its cap, and decodes batched to plain greedy output."""
    method = registry.get(name)
    runner = env.runner
    plain = [decode_plain(runner, p, TOKENS).tokens for p in PROMPTS]
    for label, settings in method.examples(runner.model, tmp_path).items():
        if cape:
            settings = settings.model_copy(
                update={"cape": CAPE.model_copy(update={"chain_depth": 3})}
            )
        size = method.draft_size(settings)
        for candidate, (cap, smaller) in method.load_settings(settings).items():
            if cap is None:
                continue
            assert size is not None and cap < size, (label, candidate)
            assert method.draft_size(smaller) <= cap, (label, candidate)
            make = method.deployed_drafter(smaller, env)
            drafts = Recorder(make())
            decode_speculative(runner, drafts, PROMPTS[1], TOKENS)
            assert max(len(d.tokens) for d in drafts.drafts) <= cap, (label, candidate)
            run = decode_batch(runner, PROMPTS, TOKENS, 2, make)
            assert [r.tokens for r in run.results] == plain, (label, candidate)
