"""The GLIDE draft's fixed-shape step (``heads.static_glide``) against the eager draft,
run eagerly on a CPU and recorded as CUDA graphs on a GPU (where the GPU check runs this
file): the same draft logits for a commit under its stale cross mask, one row, a chain,
after the target's cache is cropped or compacted, and for two sequences in their lanes;
the draft's lane tied to its target cache's; the same greedy tokens with the target's
step and the draft's both on (GLIDE, GLIDE+CAPE, one sequence or several decoded
together); the calls it cannot run left to the eager draft; what it recorded dropped
when the target's storage is replaced; no value read back to the host inside it; a
refused recording is one warning."""

from __future__ import annotations

import pytest
import torch

# the host-read guard and the device (a GPU where there is one: the GPU check runs this
# file there, and the steps are then recorded as CUDA graphs), as fixtures
from test_static_step import DEVICE, inputs_made, no_host_reads, on_device  # noqa: F401

from autotune.drafters.glide import GlideDrafter
from autotune.drafters.self_spec import DraftExitPolicy
from autotune.engine import buckets
from autotune.engine.batched import decode_batch
from autotune.engine.decoding import decode_plain, decode_speculative
from autotune.engine.runner import Runner
from autotune.engine.static import StaticCache
from autotune.heads.eagle import DraftProjection
from autotune.heads.glide import GlideRows, stale_visibility
from autotune.heads.static_glide import GlideStep, kept
from autotune.methods import registry
from autotune.methods.base import DraftEnv
from autotune.methods.cape.settings import CapeSettings
from autotune.models.ref import TargetRef
from autotune.training.glide import new_draft

pytestmark = pytest.mark.usefixtures("one_thread", "on_device")

PROMPTS = [[1, 70, 3, 3, 3, 90, 12, 8, 77], [1, 5, 9, 13, 40, 41], [1, *range(20, 95)]]
COMMITTED = 9  # the target entries a twin's prompt leaves


@pytest.fixture
def runners(tiny_llama):
    """The tiny LLaMA's eager runner and one with the target's step (float32, on
    ``DEVICE``)."""
    return Runner(tiny_llama, static=False), Runner(tiny_llama, static=True)


@pytest.fixture
def draft(tiny_llama):
    """A two-layer draft (two target layers read), warm-started from the tiny target: its
    chains are often right on the target's looping output."""
    torch.manual_seed(0)
    return new_draft(tiny_llama, 2).eval()


class DraftTwin:
    """The same draft calls on an eager draft cache and on one the step lent, both reading
    one target cache (``prompt`` prefilled; lent by the target's step where ``runner`` has
    one), compared: draft logits within 1e-5, and the caches' lengths. The step lends the
    draft cache in ``lane`` (None: the target cache's)."""

    def __init__(self, step: GlideStep, runner: Runner, projection, prompt, lane=None):
        self.step, self.runner, self.projection = step, runner, projection
        self.target = runner.new_cache(100)
        ids = torch.tensor(prompt)
        runner.forward(ids, torch.arange(len(prompt)), self.target)
        self.eager_cache = step.draft.new_cache(100)
        self.fixed_cache = step.lend(100, self.target.lane if lane is None else lane)
        self.generator = torch.Generator(DEVICE).manual_seed(len(prompt))

    def rows(self, start: int, count: int, stale: bool = False) -> tuple[GlideRows, GlideRows]:
        """Rows at ``start`` onward reading the target's committed entries (all of them,
        or with ``stale`` the commit's cross mask, as ``GlideDrafter._commit`` makes it)."""
        committed = self.target.lengths[0]
        embeds = torch.randn(count, self.runner.config.hidden_size, generator=self.generator)
        positions = torch.arange(start, start + count)
        read = self.step.draft.read_target(self.target, committed)
        cross = stale_visibility(positions.clamp(max=committed), committed) if stale else None
        return (
            GlideRows(embeds, positions, read, self.eager_cache, cross),
            GlideRows(embeds, positions, read, self.fixed_cache, cross, target=self.target),
        )

    def expected(self, eager: GlideRows) -> torch.Tensor:
        return self.projection(self.step.draft.forward_rows([eager])[-1])

    def call(self, start: int, count: int, stale: bool = False) -> None:
        eager, fixed = self.rows(start, count, stale)
        out = self.step.forward([fixed], self.projection)
        assert out is not None, "the call should run in the step"
        torch.testing.assert_close(out[0], self.expected(eager), rtol=1e-5, atol=1e-5)
        assert self.fixed_cache.lengths == self.eager_cache.lengths

    def eager_call(self, start: int, count: int) -> None:
        """A call the step must leave to the eager draft, which still gives its values."""
        eager, fixed = self.rows(start, count)
        assert self.step.forward([fixed], self.projection) is None
        got = self.projection(self.step.draft.forward_rows([fixed])[-1])
        torch.testing.assert_close(got, self.expected(eager), rtol=1e-5, atol=1e-5)
        assert self.fixed_cache.lengths == self.eager_cache.lengths

    def crop(self, length: int) -> None:
        self.eager_cache.crop(length)
        self.fixed_cache.crop(length)

    def verify(self, tokens: list[int], keep: list[int] | None = None) -> None:
        """The target's verify forward over ``tokens`` at its committed length, then the
        accepted rows kept (compacted) or, without ``keep``, all of them."""
        start = self.target.lengths[0]
        ids, positions = torch.tensor(tokens), torch.arange(start, start + len(tokens))
        self.runner.forward(ids, positions, self.target)
        if keep is not None:
            self.target.keep(start, torch.tensor(keep))


@pytest.fixture
def twin(runners, draft):
    fixed = runners[1]
    step = GlideStep.of(draft, fixed.static)
    assert step is not None
    return DraftTwin(step, fixed, DraftProjection(fixed.lm_head), PROMPTS[0])


@torch.inference_mode()
@pytest.mark.usefixtures("inputs_made")
def test_draft_step_equals_the_eager_draft(twin):
    calls = twin.step.calls
    assert twin.target.lengths[0] == COMMITTED and twin.fixed_cache.lane == twin.target.lane
    twin.call(0, COMMITTED + 1, stale=True)  # the first commit, root last: bucket 12
    twin.call(COMMITTED + 1, 1)  # a chain's steps, one row each, all the target's entries
    twin.call(COMMITTED + 2, 1)
    assert calls == {12: 1, 1: 2}
    twin.crop(COMMITTED + 1)  # the drafted entries dropped, as the next proposal does
    twin.verify([11, 12, 13, 14], keep=[0, 2])  # an accepted path, compacted
    twin.call(COMMITTED + 1, 2, stale=True)  # the next commit: 2 new rows (the root last)
    twin.call(COMMITTED + 3, 1)
    twin.crop(COMMITTED + 3)
    twin.target.crop(COMMITTED - 2)  # a shorter target cache: fewer entries read
    twin.call(COMMITTED + 3, 5, stale=True)  # 5 rows of bucket 6
    twin.verify([20, 21, 22])  # a longer one
    twin.call(COMMITTED + 8, 3)
    assert sum(calls.values()) == 7  # every call ran in the step


@torch.inference_mode()
def test_padded_rows_write_only_the_scratch_column(twin):
    twin.call(0, 5)  # 5 rows of bucket 6 (the padded row's keys go to the scratch column)
    lane = twin.fixed_cache.lane
    for store in (*twin.step.storage.keys, *twin.step.storage.values):
        written = store[lane].abs().sum(dim=(0, 2)) > 0  # per column of the lane
        assert written[:5].all() and not written[5 : twin.step.scratch].any()


@torch.inference_mode()
def test_two_sequences_run_in_their_lanes_together(twin):
    other = DraftTwin(twin.step, twin.runner, twin.projection, PROMPTS[1])
    assert other.target.lane == other.fixed_cache.lane == 1
    twin.call(0, COMMITTED)  # each alone, lane 1's in a step over two lanes
    other.call(0, 4)
    calls = [twin.rows(COMMITTED, 3), other.rows(4, 1)]
    out = twin.step.forward([fixed for _, fixed in calls], twin.projection)
    assert out is not None and twin.step.calls[3] == 1 and twin.step.batched == {2: 1}
    for (eager, _), got, owner in zip(calls, out, (twin, other)):
        torch.testing.assert_close(got, owner.expected(eager), rtol=1e-5, atol=1e-5)


@torch.inference_mode()
def test_the_draft_cache_takes_its_target_caches_lane(twin, draft):
    """A target cache in lane 2 (lanes 0 and 1 free on the draft's side): the draft's
    cache is lent lane 2 of a storage grown to 4 lanes, and the step reads that lane."""
    runner = twin.runner
    busy = [runner.new_cache(100) for _ in range(2)]  # lanes 1 and 2 of the target's
    del busy[1]  # lane 2 free again
    third = DraftTwin(twin.step, runner, twin.projection, PROMPTS[1])
    assert third.target.lane == third.fixed_cache.lane == 2 and twin.step.storage.lanes == 4
    third.call(0, 7, stale=True)
    third.call(7, 1)
    twin.call(0, 3)  # lane 0 still exact in a 1-lane step beside it
    assert twin.step.calls == {8: 1, 1: 1, 3: 1}


@torch.inference_mode()
def test_calls_the_step_cannot_run_take_the_eager_draft(twin, runners, draft):
    twin.eager_call(0, buckets.LARGEST + 1)  # more rows than the largest bucket
    assert twin.fixed_cache.on_loan  # written in place, into the lent storage
    twin.call(buckets.LARGEST + 1, 2)
    # a draft cache in another lane than its target cache's (lane 1): it takes lane 0,
    # whose draft cache gives it back and reads its own storage from then on
    crossed = DraftTwin(twin.step, twin.runner, twin.projection, PROMPTS[1], lane=0)
    assert crossed.target.lane == 1 and not twin.fixed_cache.on_loan
    crossed.eager_call(0, 3)
    twin.eager_call(buckets.LARGEST + 3, 1)
    eager = runners[0]  # a target cache the target's step did not lend
    DraftTwin(twin.step, eager, twin.projection, PROMPTS[1], lane=3).eager_call(0, 3)
    assert sum(twin.step.calls.values()) == 1


@torch.inference_mode()
def test_a_replaced_target_storage_drops_the_recorded_steps(twin):
    """A target cache that needs more columns replaces the target's storage (the live
    caches' entries moved along): the step's runs over the old one are dropped, and the
    next calls read the new one."""
    twin.call(0, COMMITTED + 1, stale=True)
    version = twin.runner.static.storage.version
    longer = twin.runner.new_cache(2 * twin.runner.static.columns)
    assert twin.runner.static.storage.version > version and longer.lane == 1
    twin.call(COMMITTED + 1, 1)
    assert set(twin.step._runs) == {(1, 1, twin.projection.linear)}  # remade since
    assert twin.step.buffers[1, 1].cross_seen.shape[-1] == twin.runner.static.columns


def speculative_cases(tiny_llama_dir, tmp_path):
    """Each GLIDE example setting of the registry, with and without CAPE, as (label,
    settings)."""
    ref = TargetRef.for_user(str(tiny_llama_dir), dtype="float32", device=DEVICE)
    eager = Runner(ref.runner().model, static=False)
    cape = CapeSettings(bins=[0.3, 0.6, 1.0], expansion=[5, 3, 1], max_verify_tokens=10)
    cases = []
    for label, settings in registry.get("glide").examples(eager.model, tmp_path).items():
        cases.append((label, settings))
        with_cape = settings.model_copy(update={"cape": cape.model_copy(update={"chain_depth": 3})})
        cases.append((f"{label}+cape", with_cape))
    return ref, eager, cases


def test_speculative_decoding_is_token_identical_with_both_steps(
    tiny_llama_dir, tmp_path, same_greedy
):
    """GLIDE and GLIDE+CAPE from the registry's examples (one and two draft layers, an
    exit threshold, a draft vocabulary), both steps on; the 75-token prompt's first
    commit (past the largest bucket) eager."""
    ref, eager, cases = speculative_cases(tiny_llama_dir, tmp_path)
    fixed = Runner(eager.model, static=True)
    expected = {tuple(p): decode_plain(eager, p, 30).tokens for p in PROMPTS}
    method = registry.get("glide")
    for label, settings in cases:
        new_drafter = method.deployed_drafter(settings, DraftEnv(ref, fixed))
        for prompt in PROMPTS:
            drafter = new_drafter()
            glide = getattr(drafter, "base", drafter)
            before = runs_in_steps(glide.draft)
            result = decode_speculative(fixed, drafter, prompt, 30)
            same_greedy(fixed, prompt, result.tokens, expected[tuple(prompt)], label)
            step = glide.step
            assert step is not None and step.target is fixed.static, label
            assert isinstance(glide.cache, StaticCache) and step.storage.holds(glide.cache)
            # a run or more a proposal (a call, or a whole chain), all but a 76-row commit
            assert runs_in_steps(glide.draft) - before >= result.steps, label


def runs_in_steps(draft) -> int:
    """The draft's calls run in its step so far, and its chains run in theirs."""
    step = kept(draft)
    if step is None:
        return 0
    chains = getattr(step, "_autotune_chains", None)
    return sum(step.calls.values()) + (0 if chains is None else chains.calls)


def test_the_glide_drafter_drafts_as_the_eager_draft(runners, draft, same_greedy):
    """Both steps on: the same tokens as plain greedy decoding, and on a CPU the same
    drafts as the eager draft (a GPU's kernels, chosen per row count, may flip a
    near-tie); a target without a step lends the draft nothing."""
    eager, fixed = runners
    vocabulary = DraftProjection(fixed.lm_head, list(range(3, 128, 2)))
    for projection in (None, vocabulary):
        for policy in (DraftExitPolicy(4, 0.0, None), DraftExitPolicy(6, 0.4, None)):
            for prompt in PROMPTS:
                expected = decode_plain(eager, prompt, 30).tokens
                alone = decode_speculative(
                    eager, GlideDrafter(draft, policy, projection), prompt, 30
                )
                drafter = GlideDrafter(draft, policy, projection)
                result = decode_speculative(fixed, drafter, prompt, 30)
                same_greedy(fixed, prompt, result.tokens, expected)
                if DEVICE == "cpu":
                    assert (result.drafted, result.accepted) == (alone.drafted, alone.accepted)
                assert drafter.step is GlideStep.of(draft, fixed.static)
    step = GlideStep.of(draft, fixed.static)
    assert step is not None and {linear for *_, linear in step._runs} >= {vocabulary.linear}
    assert sum(step.calls.values()) > 50
    drafter = GlideDrafter(draft, DraftExitPolicy(4, 0.0, None))
    decode_speculative(eager, drafter, PROMPTS[0], 5)
    assert drafter.step is None and not isinstance(drafter.cache, StaticCache)


def test_batched_decoding_runs_the_sequences_draft_calls_in_one_step(runners, draft, same_greedy):
    """Sequences decoded together (``engine.batched``) each draft in their target cache's
    lane, and their drafting calls of one round run as one step over the lanes."""
    eager, fixed = runners
    prompts = [*PROMPTS[:2], [1, 22], [1, 100, 3, 3, 3, 100, 3]]
    policy = DraftExitPolicy(4, 0.2, None)
    run = decode_batch(fixed, prompts, 20, 4, lambda: GlideDrafter(draft, policy))
    for prompt, result in zip(prompts, run.results, strict=True):
        same_greedy(fixed, prompt, result.tokens, decode_plain(eager, prompt, 20).tokens)
    step = GlideStep.of(draft, fixed.static)
    assert step is not None and step.storage.lanes == 4 and step.batched[4] > 0


@torch.inference_mode()
def test_the_draft_step_reads_nothing_back_to_the_host(twin, no_host_reads):  # noqa: F811
    twin.call(0, COMMITTED + 1, stale=True)
    for count, stale in ((1, False), (5, False), (3, True)):
        twin.crop(COMMITTED + 1)
        eager, fixed = twin.rows(COMMITTED + 1, count, stale)
        with no_host_reads():  # the copy-in, the step (what a graph replays), the copy-out
            out = twin.step.forward([fixed], twin.projection)
        assert out is not None
        torch.testing.assert_close(out[0], twin.expected(eager), rtol=1e-5, atol=1e-5)


def test_a_refused_recording_is_one_warning_and_the_same_tokens(
    runners, draft, monkeypatch, capsys, same_greedy
):
    """A torch release whose compiler refuses the draft's step (``how="compile"``; a
    refused CUDA graph takes the same path) costs speed, not the run: one warning, then
    every draft call eager, the same tokens."""
    eager, fixed = runners
    step = GlideStep.of(draft, fixed.static)
    assert step is not None
    step.recorder.how = "compile"  # as on a GPU asked to compile

    def unsupported(run, statics):
        raise NotImplementedError("torch._dynamo: data-dependent operator not supported\n...")

    monkeypatch.setattr(step.recorder, "_compiled", unsupported)
    for prompt in PROMPTS[:2]:
        expected = decode_plain(eager, prompt, 30).tokens
        drafter = GlideDrafter(draft, DraftExitPolicy(4, 0.0, None))
        same_greedy(fixed, prompt, decode_speculative(fixed, drafter, prompt, 30).tokens, expected)
        assert drafter.step is step
    assert step.failed is not None and "data-dependent" in step.failed
    assert sum(step.calls.values()) == 0 and sum(fixed.static.calls.values()) > 0
    said = " ".join(capsys.readouterr().err.split())  # the console folds long lines
    assert said.count("warning:") == 1 and "torch.compile the GLIDE draft's" in said
