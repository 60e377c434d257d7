"""Batched forwards and batched decoding (``Runner.forward_batch``, ``engine.batched``):
each sequence in a batch is computed as it would be alone."""

from __future__ import annotations

import pytest
import torch

from autotune.engine import native
from autotune.engine.batched import decode_batch
from autotune.engine.decoding import decode_plain
from autotune.engine.runner import Runner
from autotune.engine.segment import Segment

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = [[1, 5, 9, 33, 70], [1, 100, 3, 3, 3, 100, 3], [1, 40], [1, 40, 41, 42, 43, 44, 45]]


@pytest.mark.skipif(not native.available(), reason="no C++ compiler for the engine's code")
@pytest.mark.parametrize("use_native", [True, False], ids=["c++ layers", "python layers"])
def test_each_segment_of_a_batched_forward_equals_its_own_forward(
    tiny_llama, use_native, small_kernel_everywhere
):
    """Bit for bit where every product takes the engine's own kernel, which gives a row
    the same bits in any batch (torch's kernels may not: ``test_stack``)."""
    runner = Runner(tiny_llama, native=use_native)
    assert (runner.stack is not None) == use_native
    together, segments = [], []
    for prompt in [p for p in PROMPTS if len(p) > 2]:
        ids = torch.tensor(prompt)
        positions = torch.arange(len(prompt))
        runner.forward(ids[:-2], positions[:-2], cache := runner.new_cache())
        # the prefix is cached; the last two tokens come in the batched forward, one
        # segment causal, one under a mask that hides the second token's own predecessor
        runner.forward(ids[:-2], positions[:-2], batched := runner.new_cache())
        mask = torch.tensor([[True, False], [False, True]]) if len(segments) % 2 else None
        segments.append(Segment(ids[-2:], positions[-2:], batched, mask=mask))
        together.append((cache, ids[-2:], positions[-2:], mask))
    outputs = runner.forward_batch(segments)
    for out, (cache, ids, positions, mask), segment in zip(outputs, together, segments):
        expected = runner.forward(ids, positions, cache, mask=mask)
        assert torch.equal(out.logits, expected.logits)
        assert torch.equal(out.hidden, expected.hidden)
        assert segment.cache.lengths == cache.lengths


def test_last_only_segments_keep_one_row_each(tiny_llama):
    runner = Runner(tiny_llama)
    segments = [
        Segment(torch.tensor(p), torch.arange(len(p)), runner.new_cache(), last_only=i % 2 == 0)
        for i, p in enumerate(PROMPTS)
    ]
    outputs = runner.forward_batch(segments)
    assert [len(out.logits) for out in outputs] == [1, 7, 1, 7]
    assert [len(out.hidden) for out in outputs] == [len(p) for p in PROMPTS]


@pytest.mark.parametrize("concurrency", [1, 2, 3, 8])
def test_batched_plain_greedy_equals_one_at_a_time(tiny_llama, concurrency):
    runner = Runner(tiny_llama)
    runner.eos_token_ids = frozenset()
    ended: list[int] = []
    run = decode_batch(runner, PROMPTS * 2, 20, concurrency, on_done=lambda: ended.append(1))
    assert [r.tokens for r in run.results] == [
        decode_plain(runner, p, 20).tokens for p in PROMPTS
    ] * 2
    assert len(ended) == 8  # told once as each request ended
    assert run.tokens == 8 * 20 and run.throughput > 0
    assert len(run.latencies) == 8 and all(t > 0 for t in run.latencies)
    # every forward holds at most ``concurrency`` sequences: fewer forwards as it grows
    assert run.forwards >= 8 * 19 / concurrency  # the first token comes from the prefill
    assert 0 < run.prefill_seconds < run.seconds


def test_concurrency_below_one_is_refused(tiny_llama):
    with pytest.raises(ValueError, match="concurrency"):
        decode_batch(Runner(tiny_llama), PROMPTS, 4, 0)


def test_kept_prefills_are_copied_and_decode_the_same(tiny_llama):
    from autotune.engine.batched import Prefills

    runner = Runner(tiny_llama)
    runner.eos_token_ids = frozenset()
    prefills = Prefills()
    first = decode_batch(runner, PROMPTS, 12, 2, prefills=prefills)
    assert len(prefills._kept) == len(PROMPTS)
    again = decode_batch(runner, PROMPTS, 12, 2, prefills=prefills)
    assert [r.tokens for r in again.results] == [r.tokens for r in first.results]
    # the copies are the caches' own: decoding again did not write into the kept ones
    kept = prefills.get(PROMPTS[1])
    assert kept is not None and kept.cache.lengths == [len(PROMPTS[1])] * runner.num_layers
    assert (first.prefilled, again.prefilled) == (len(PROMPTS), 0)
    small = Prefills(max_bytes=1)  # nothing fits: every prompt prefilled afresh
    assert decode_batch(runner, PROMPTS, 4, 2, prefills=small).prefilled == len(PROMPTS)
    assert small.get(PROMPTS[0]) is None


def test_layer_skip_drafts_of_several_requests_share_each_draft_forward(tiny_llama):
    from autotune.drafters.self_spec import DraftExitPolicy, LayerSkipDrafter
    from autotune.engine.skip import NO_SKIP, SkipMask

    runner = Runner(tiny_llama)
    runner.eos_token_ids = frozenset()
    skip = SkipMask(attention=frozenset({1}), mlp=frozenset({2}))
    policy = DraftExitPolicy(max_tokens=4, exit_threshold=0.0, adaptive=None)
    sizes = []
    forward_batch = runner.forward_batch

    def recording(segments, *, skip=NO_SKIP, **kwargs):
        if skip.size:
            sizes.append(len(segments))
        return forward_batch(segments, skip=skip, **kwargs)

    runner.forward_batch = recording  # type: ignore[method-assign]
    run = decode_batch(runner, PROMPTS, 16, 4, lambda: LayerSkipDrafter(skip, policy))
    runner.forward_batch = forward_batch  # type: ignore[method-assign]
    assert [r.tokens for r in run.results] == [decode_plain(runner, p, 16).tokens for p in PROMPTS]
    assert max(sizes) == 4  # one draft forward a step for the four requests in flight


@pytest.mark.skipif(not native.available(), reason="no C++ compiler for the engine's code")
@pytest.mark.parametrize(
    "kind",
    [
        "eagle static tree",
        "eagle dynamic tree",
        "eagle chain with cape",
        "glide",
        "glide with cape",
    ],
)
def test_draft_forwards_of_several_requests_are_shared(
    tiny_llama, random_eagle_head, small_kernel_everywhere, kind
):
    """EAGLE's head and GLIDE's draft run once a drafting step for all requests in flight.
    Proposed together, each request drafts what it drafts alone (every product takes the
    engine's own kernel, which gives a row the same bits in any batch), so each accepts
    as much, and its output is its plain greedy output."""
    from autotune.drafters.cape import CapeDrafter, CapePolicy
    from autotune.drafters.eagle import DynamicTree, EagleDrafter, StaticTree
    from autotune.drafters.glide import GlideDrafter
    from autotune.drafters.self_spec import DraftExitPolicy
    from autotune.engine.decoding import decode_speculative
    from autotune.training.glide import new_draft

    runner = Runner(tiny_llama)
    runner.eos_token_ids = frozenset()
    torch.manual_seed(0)
    model = random_eagle_head(tiny_llama) if kind.startswith("eagle") else new_draft(tiny_llama, 2)
    cape = CapePolicy(edges=(0.5, 1.0), expansion=(3, 1))

    def new_drafter():
        if kind == "eagle static tree":
            return EagleDrafter(model, StaticTree(((0,), (1,), (0, 0), (0, 1), (1, 0))))
        if kind == "eagle dynamic tree":
            return EagleDrafter(model, DynamicTree(total_tokens=8, depth=2, top_k=2))
        if kind == "eagle chain with cape":
            chain = EagleDrafter(model, StaticTree(((0,), (0, 0), (0, 0, 0))), ranked_width=3)
            return CapeDrafter(chain, cape)
        glide = GlideDrafter(model.eval(), DraftExitPolicy(4, 0.3, None), ranked_width=3)
        return CapeDrafter(glide, cape) if kind.endswith("cape") else glide

    sizes = []
    forward_rows = model.forward_rows

    def recording(sequences):
        sizes.append(len(sequences))
        return forward_rows(sequences)

    model.forward_rows = recording  # type: ignore[method-assign]
    run = decode_batch(runner, PROMPTS, 16, 4, new_drafter)
    model.forward_rows = forward_rows  # type: ignore[method-assign]
    # where the head runs as a fixed-shape step (on a GPU), its runs count the requests
    # each one held; forward_rows is its eager path
    step = getattr(model, "_autotune_step", None)
    widest = max([*sizes, *(step.batched if step is not None else ())])
    assert widest == 4  # one draft forward a drafting step for the four requests
    for prompt, result in zip(PROMPTS, run.results):
        alone = decode_speculative(runner, new_drafter(), prompt, 16)
        assert result.tokens == alone.tokens == decode_plain(runner, prompt, 16).tokens
        assert (result.drafted, result.accepted) == (alone.drafted, alone.accepted)
    assert sum(r.accepted for r in run.results) > 0
