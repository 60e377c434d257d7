"""The fixed-shape step (``engine.static``) over several sequences, each in a lane of its
storage, run eagerly on the CPU against the runner's own layers: a batched forward as one
step over the lanes, each segment as its own eager forward; batched decoding token for
token; lanes taken back from sequences that are gone, and caches kept long given storage
of their own rather than lanes."""

# ruff: noqa: F811 (the fixtures imported from test_static_step are redefined by name)
from __future__ import annotations

import pytest
import torch
from test_static_step import DEVICE, PROMPT, TREE, Twin, on_device, pair  # noqa: F401

from autotune.engine.batched import Prefills, decode_batch
from autotune.engine.decoding import decode_plain
from autotune.engine.runner import Runner
from autotune.engine.segment import Segment
from autotune.engine.skip import SkipMask
from autotune.methods import registry
from autotune.methods.base import DraftEnv
from autotune.models.ref import TargetRef

pytestmark = pytest.mark.usefixtures("one_thread", "on_device")


def test_a_batched_forward_runs_as_one_step_over_the_lanes(pair):
    """Sequences of different lengths, in lanes 0 and 2 (lane 1's sequence is not in the
    call: its lane runs as padding and its entries stay as they were), each segment's
    logits as its own eager forward; a tree mask in one of them."""
    eager, fixed = pair
    twins = [Twin(eager, fixed) for _ in range(3)]
    for twin, prompt in zip(twins, [PROMPT, [1, 100, 3], [1, *range(40, 52)]]):
        twin.forward(prompt, 0)
    idle = [store.clone() for store in twins[1].fixed_cache.keys]
    calls = [
        (twins[0], [20, 21, 22, 23, 24, 25, 26], TREE.attention_mask(DEVICE), len(PROMPT)),
        (twins[2], [7, 8], None, 13),
    ]
    segments, expected = [], []
    for twin, tokens, mask, start in calls:
        ids = torch.tensor(tokens)
        offsets = TREE.position_offsets(DEVICE) if mask is not None else torch.arange(len(ids))
        positions = start + offsets
        expected.append(eager.forward(ids, positions, twin.eager_cache, mask=mask))
        segments.append(Segment(ids, positions, twin.fixed_cache, mask=mask))
    outputs = fixed.forward_batch(segments)
    assert fixed.static.batched == {2: 1}  # lanes 0..2, run as the bucket of 4 lanes
    for want, got, (twin, *_) in zip(expected, outputs, calls):
        torch.testing.assert_close(got.logits, want.logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got.hidden, want.hidden, rtol=1e-5, atol=1e-5)
        assert twin.fixed_cache.lengths == twin.eager_cache.lengths
    for before, after in zip(idle, twins[1].fixed_cache.keys):
        assert torch.equal(before[:, :, :-1], after[:, :, :-1])  # all but its scratch column


@pytest.mark.parametrize("speculative", [False, True], ids=["plain", "ngram"])
def test_batched_decoding_is_token_identical_with_the_step(
    tiny_llama_dir, tmp_path, speculative, same_greedy
):
    ref = TargetRef.for_user(str(tiny_llama_dir), dtype="float32", device=DEVICE)
    eager = Runner(ref.runner().model, static=False)
    fixed = Runner(eager.model, static=True)
    prompts = [[1, 100, 3, 3, 3, 100, 3], [1, 40, 41, 42, 43, 44], PROMPT, [1, 5, 5, 5]]
    new_drafter = None
    if speculative:
        method = registry.get("ngram")
        settings = next(iter(method.examples(eager.model, tmp_path).values()))
        new_drafter = method.deployed_drafter(settings, DraftEnv(ref, fixed))
    expected = [decode_plain(eager, prompt, 40).tokens for prompt in prompts]
    prefills = Prefills()
    for again in (False, True):  # again: the prompts' prefills copied into lent lanes
        fixed.static.batched.clear()
        run = decode_batch(fixed, prompts, 40, 3, new_drafter=new_drafter, prefills=prefills)
        for prompt, result, want in zip(prompts, run.results, expected, strict=True):
            same_greedy(fixed, prompt, result.tokens, want)
        assert run.prefilled == (0 if again else len(prompts))
        assert sum(fixed.static.batched.values()) > 0  # several sequences ran in one step


def test_a_lane_held_only_by_a_reference_cycle_is_taken_back(pair):
    """A sequence gone but caught in a cycle keeps its lane until the collector runs:
    the storage collects before it grows, rather than taking memory for it."""
    fixed = pair[1]
    cache = fixed.new_cache(100)
    cache.me = cache  # type: ignore[attr-defined]  # a cycle: refcounting alone keeps it
    del cache
    again = fixed.new_cache(100)
    assert again.lane == 0 and fixed.static.storage.lanes == 1


def test_caches_kept_long_take_storage_of_their_own_not_lanes(pair):
    """A layer-skip search keeps a frozen trace cache per prompt for every mask it tries:
    in lanes they would push each later decoding to a high lane, whose calls run every
    lane below it (seen: n-gram measured at 0.45x on a CPU, 1.47x without them)."""
    from autotune.measure.draft_trace import DraftTracer

    fixed = pair[1]
    tracer = DraftTracer(fixed, [(PROMPT, [3, 4, 5]), ([1, 9, 9], [7, 7])])
    assert tracer.traces(SkipMask.of(mlp=[1]))
    assert not fixed.static.storage.live()
    assert decode_plain(fixed, PROMPT, 8).tokens  # a decoding takes lane 0
    assert fixed.new_cache(100).lane == 0
