"""The EAGLE head's fixed-shape step (``heads.static_head``) against the eager head, run
eagerly on a CPU and recorded as CUDA graphs on a GPU (where the GPU check runs this
file): the same features and draft logits for one row, a chain, a tree expansion whose
mask spans the head's cached prefix, after crop and keep, and for two sequences in their
lanes; the same greedy tokens with the target's step and the head's both on (EAGLE-1's
static tree, EAGLE-2's dynamic one), one sequence or several decoded together; the calls
it cannot run left to the eager head; no value read back to the host inside it; a
refused recording is one warning."""

from __future__ import annotations

import pytest
import torch

# the host-read guard and the device (a GPU where there is one: the GPU check runs this
# file there, and the steps are then recorded as CUDA graphs), as fixtures
from test_static_step import DEVICE, inputs_made, no_host_reads, on_device  # noqa: F401

from autotune.drafters.eagle import EAGLE1_TREE, DynamicTree, EagleDrafter, StaticTree
from autotune.engine import buckets
from autotune.engine.batched import decode_batch
from autotune.engine.decoding import decode_plain, decode_speculative
from autotune.engine.kvcache import KVCache
from autotune.engine.runner import Runner
from autotune.engine.static import StaticCache
from autotune.heads.eagle import CommitRows, DraftProjection, HeadRows
from autotune.heads.static_head import EagleStep

pytestmark = pytest.mark.usefixtures("one_thread", "on_device")

PROMPTS = [[1, 70, 3, 3, 3, 90, 12, 8, 77], [1, 5, 9, 13, 40, 41], [1, *range(20, 95)]]
COMMITTED = 9  # the pairs a twin's first call commits


@pytest.fixture
def runners(tiny_llama):
    """The tiny LLaMA's eager runner and one with the target's step (float32, on
    ``DEVICE``)."""
    return Runner(tiny_llama, static=False), Runner(tiny_llama, static=True)


@pytest.fixture
def head(tiny_llama, random_eagle_head):
    return random_eagle_head(tiny_llama)


class HeadTwin:
    """The same head calls on an eager cache and on a cache the step lent, compared:
    predicted features and draft logits within 1e-5, and the caches' lengths."""

    def __init__(self, step: EagleStep, runner: Runner, projection: DraftProjection):
        self.step, self.runner, self.projection = step, runner, projection
        self.eager_cache, self.fixed_cache = step.head.new_cache(100), step.lend(100)
        self.generator = torch.Generator(DEVICE).manual_seed(len(step.storage.live()))

    def rows(self, start: int, count: int, mask=None) -> tuple[HeadRows, HeadRows]:
        features = torch.randn(count, self.step.head.hidden_size, generator=self.generator)
        tokens = torch.randint(3, 120, (count,), generator=self.generator)
        positions = torch.arange(start, start + count)
        pair = features, self.runner.embed(tokens), positions
        return HeadRows(*pair, self.eager_cache, mask), HeadRows(*pair, self.fixed_cache, mask)

    def commit_rows(self, start: int, count: int) -> tuple[HeadRows, CommitRows]:
        """A commit's rows as the target leaves them (hidden states before its final norm,
        tokens), for the step; and as the eager head takes them."""
        hidden = 3 * torch.randn(count, self.step.head.hidden_size, generator=self.generator)
        tokens = torch.randint(3, 120, (count,), generator=self.generator)
        positions = torch.arange(start, start + count)
        target = self.runner.norm, self.runner.embed
        eager = CommitRows(hidden, tokens, positions, self.eager_cache, *target).pairs()
        return eager, CommitRows(hidden, tokens, positions, self.fixed_cache, *target)

    def check(self, eager: HeadRows, fixed: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        expected = self.step.head.forward_rows([eager])
        features, logits = fixed[0]
        torch.testing.assert_close(features, expected, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(logits, self.projection(expected), rtol=1e-5, atol=1e-5)
        assert self.fixed_cache.lengths == self.eager_cache.lengths

    @property
    def caches(self) -> tuple[KVCache, KVCache]:
        return self.eager_cache, self.fixed_cache

    def call(self, start: int, count: int, mask=None) -> None:
        eager, fixed = self.rows(start, count, mask)
        out = self.step.forward([fixed], self.projection)
        assert out is not None, "the call should run in the step"
        self.check(eager, out)

    def eager_call(self, start: int, count: int, mask=None) -> None:
        """A call the step must leave to the eager head, which still gives its values."""
        eager, fixed = self.rows(start, count, mask)
        assert self.step.forward([fixed], self.projection) is None
        fixed_out = self.step.head.forward_rows([fixed])
        self.check(eager, [(fixed_out, self.projection(fixed_out))])


@pytest.fixture
def twin(runners, head):
    step = EagleStep(head, "graph")  # eager on a CPU
    return HeadTwin(step, runners[1], DraftProjection(runners[1].lm_head))


def expansion(prefix: int, seen: list[list[int]]) -> torch.Tensor:
    """An EAGLE-2 level's mask [S, P + S]: each row sees the committed pairs, the draft
    columns of its ancestors (``seen``) and itself, as ``EagleDrafter._expand`` makes it."""
    mask = torch.zeros(len(seen), prefix + len(seen), dtype=torch.bool)
    mask[:, :COMMITTED] = True
    for row, ancestors in enumerate(seen):
        mask[row, ancestors] = True
        mask[row, prefix + row] = True
    return mask


@torch.inference_mode()
@pytest.mark.usefixtures("inputs_made")
def test_head_step_equals_the_eager_head(twin):
    calls = twin.step.calls
    twin.call(0, COMMITTED)  # the prompt's pairs, causal: bucket 12
    twin.call(COMMITTED, 1)  # one row
    assert calls == {12: 1, 1: 1}
    for cache in twin.caches:
        cache.crop(COMMITTED)
    twin.call(COMMITTED, 3, expansion(COMMITTED, [[], [], []]))  # the first level
    twin.call(COMMITTED, 3, expansion(12, [[9], [9], [10]]))  # children of nodes 0, 0, 1
    twin.call(COMMITTED, 2, expansion(15, [[9, 12], [10, 14]]))  # grandchildren
    hidden = expansion(17, [[9], [10]])
    hidden[:, 2] = False  # a committed pair hidden too: the mask over the prefix is read
    twin.call(COMMITTED, 2, hidden)
    for cache in twin.caches:
        cache.keep(COMMITTED, torch.tensor([0, 3, 6]))  # an accepted path, made contiguous
    twin.call(COMMITTED + 3, 5)  # a chain of 5 after it, padded to 6
    for cache in twin.caches:
        cache.crop(COMMITTED + 1)
    twin.call(COMMITTED + 1, 4, torch.ones(4, 4, dtype=torch.bool).tril())  # [S, S] mask
    assert sum(calls.values()) == 8  # every call ran in the step


@torch.inference_mode()
@pytest.mark.usefixtures("inputs_made")
def test_a_commit_is_normed_and_embedded_inside_the_step(twin):
    """The target's hidden states and tokens as its verify left them: the step applies the
    target's final norm and embedding, giving what the eager head gives their pairs."""
    for start, count in ((0, COMMITTED), (COMMITTED, 3), (COMMITTED + 3, 1)):
        eager, commit = twin.commit_rows(start, count)
        out = twin.step.forward([commit], twin.projection)
        assert out is not None, "the commit should run in the step"
        twin.check(eager, out)
    variants = {variant for *_, variant in twin.step._runs}
    assert {(v.norm, v.embed) for v in variants} == {(twin.runner.norm, twin.runner.embed)}
    other = HeadTwin(twin.step, twin.runner, twin.projection)
    other.call(0, 4)
    _, commit = twin.commit_rows(COMMITTED + 4, 1)
    _, rows = other.rows(4, 1)
    assert twin.step.forward([commit, rows], twin.projection) is None  # kinds not mixed


@torch.inference_mode()
def test_padded_rows_write_only_the_scratch_column(twin):
    twin.call(0, 5)  # 5 rows of bucket 6
    for store in (*twin.step.storage.keys, *twin.step.storage.values):
        written = store[0].abs().sum(dim=(0, 2)) > 0  # per column of lane 0
        assert written[:5].all() and written[twin.step.scratch]
        assert not written[5 : twin.step.scratch].any()


@torch.inference_mode()
def test_two_sequences_run_in_their_lanes_together(twin):
    other = HeadTwin(twin.step, twin.runner, twin.projection)
    assert (twin.fixed_cache.lane, other.fixed_cache.lane) == (0, 1)
    twin.call(0, COMMITTED)  # each alone, lane 1's in a step over two lanes
    other.call(0, 4)
    calls = [twin.rows(COMMITTED, 3), other.rows(4, 1)]
    out = twin.step.forward([fixed for _, fixed in calls], twin.projection)
    assert out is not None and twin.step.calls[3] == 1  # one step, bucket of the longest
    twin.check(calls[0][0], out[:1])
    other.check(calls[1][0], out[1:])


@torch.inference_mode()
def test_calls_the_step_cannot_run_take_the_eager_head(twin, head):
    twin.eager_call(0, buckets.LARGEST + 1)  # more rows than the largest bucket
    assert twin.fixed_cache.on_loan  # written in place, into the lent storage
    twin.call(buckets.LARGEST + 1, 2)
    room = twin.step.scratch - twin.fixed_cache.lengths[0]
    twin.eager_call(buckets.LARGEST + 3, room - 1)  # past the largest bucket again
    twin.eager_call(twin.fixed_cache.lengths[0], 3)  # past the storage's columns: it grows
    assert not twin.fixed_cache.on_loan
    twin.eager_call(twin.fixed_cache.lengths[0], 1)  # its own storage from now on
    plain = HeadTwin(twin.step, twin.runner, twin.projection)
    plain.fixed_cache = head.new_cache(100)  # a cache the step did not lend
    plain.eager_call(0, 3)


@pytest.mark.parametrize(
    "tree",
    [StaticTree(EAGLE1_TREE), DynamicTree(total_tokens=60, depth=5, top_k=10)],
    ids=["eagle-1 static tree", "eagle-2 dynamic tree"],
)
def test_speculative_decoding_is_token_identical_with_both_steps(runners, head, tree, same_greedy):
    """Both steps on (what a GPU runs), the prompts' first commit (the 75-token one past
    the largest bucket: eager) included; a draft vocabulary is a projection of its own."""
    eager, fixed = runners
    vocabulary = DraftProjection(fixed.lm_head, list(range(3, 128, 2)))
    step = EagleStep.of(head, fixed.static.how)
    for projection in (None, vocabulary):
        for prompt in PROMPTS:
            expected = decode_plain(eager, prompt, 40).tokens
            alone = decode_speculative(eager, EagleDrafter(head, tree, projection), prompt, 40)
            drafter = EagleDrafter(head, tree, projection)
            before = sum(step.calls.values())
            result = decode_speculative(fixed, drafter, prompt, 40)
            same_greedy(fixed, prompt, result.tokens, expected)
            if DEVICE == "cpu":  # a GPU's kernels, chosen per row count, may flip a near-tie
                # the same drafts as the eager head's, so as much accepted
                assert (result.drafted, result.accepted) == (alone.drafted, alone.accepted)
            assert drafter.step is step and sum(step.calls.values()) > before + 10
    assert {variant.linear for *_, variant in step._runs} == {fixed.lm_head, vocabulary.linear}
    drafter = EagleDrafter(head, tree)
    decode_speculative(eager, drafter, PROMPTS[0], 5)  # a target without a step: none
    assert drafter.step is None and not isinstance(drafter.cache, StaticCache)


def test_batched_decoding_runs_the_sequences_head_calls_in_one_step(runners, head, same_greedy):
    """Sequences decoded together (``engine.batched``) each borrow a lane of the head's
    storage, and their drafting calls of one round run as one step over the lanes."""
    eager, fixed = runners
    prompts = [*PROMPTS[:2], [1, 22], [1, 100, 3, 3, 3, 100, 3]]
    tree = DynamicTree(total_tokens=12, depth=3, top_k=3)
    run = decode_batch(fixed, prompts, 20, 4, lambda: EagleDrafter(head, tree))
    for prompt, result in zip(prompts, run.results, strict=True):
        same_greedy(fixed, prompt, result.tokens, decode_plain(eager, prompt, 20).tokens)
    step = EagleStep.of(head, fixed.static.how)
    assert step.storage.lanes == 4 and step.batched[4] > 0


@torch.inference_mode()
def test_the_head_step_reads_nothing_back_to_the_host(twin, no_host_reads):  # noqa: F811
    twin.call(0, COMMITTED)
    for count, mask in ((1, None), (5, None), (3, expansion(COMMITTED, [[], [], []]))):
        for cache in twin.caches:
            cache.crop(COMMITTED)
        eager, fixed = twin.rows(COMMITTED, count, mask)
        with no_host_reads():  # the copy-in, the step (what a graph replays), the copy-out
            out = twin.step.forward([fixed], twin.projection)
        assert out is not None
        twin.check(eager, out)


def test_a_refused_recording_is_one_warning_and_the_same_tokens(
    runners, head, monkeypatch, capsys, same_greedy
):
    """A driver or torch release that refuses to record the head's step costs speed, not
    the run: one warning, then every head call eager, the same tokens."""
    eager, fixed = runners
    step = EagleStep.of(head, fixed.static.how)
    step.recorder.how = "graph"  # as on a GPU

    def refuse(run):
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing\nmore")

    monkeypatch.setattr(step.recorder, "_graph", refuse)
    for prompt in PROMPTS[:2]:
        expected = decode_plain(eager, prompt, 30).tokens
        drafter = EagleDrafter(head, DynamicTree(total_tokens=12, depth=3, top_k=3))
        same_greedy(fixed, prompt, decode_speculative(fixed, drafter, prompt, 30).tokens, expected)
    assert step.failed is not None and "not permitted" in step.failed
    assert sum(step.calls.values()) == 0 and sum(fixed.static.calls.values()) > 0
    said = " ".join(capsys.readouterr().err.split())  # the console folds long lines
    assert said.count("warning:") == 1 and "EAGLE head's" in said
