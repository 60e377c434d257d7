"""An EAGLE tree drafted by the head in one step (``heads.tree_step``), run eagerly on a
CPU and recorded as a CUDA graph on a GPU (where the GPU check runs this file): the same
drafts as the eager drafter's, a call at a time, for EAGLE-1's static tree, a static
tree whose expanded nodes are not each level's first, and EAGLE-2 dynamic trees, over
the whole vocabulary and a draft vocabulary; the sequences decoded together drafted in
one run; nothing read back to the host inside it; what it refuses (a cache off the
step, a refused recording) drafted a call at a time, from the root as the commit call
left it, with the same tokens."""

# ruff: noqa: F811 (the fixtures imported from test_static_head are redefined by name)
from __future__ import annotations

import pytest
import torch
from test_static_head import PROMPTS, head, runners  # noqa: F401
from test_static_step import DEVICE, NoHostReads, on_device  # noqa: F401

from autotune.drafters import eagle as eagle_drafting
from autotune.drafters.eagle import EAGLE1_TREE, DynamicTree, EagleDrafter, StaticTree
from autotune.engine.batched import decode_batch
from autotune.engine.decoding import decode_plain, decode_speculative
from autotune.heads.eagle import DraftProjection
from autotune.heads.static_head import EagleStep
from autotune.heads.tree_step import Level, TreeSteps

pytestmark = pytest.mark.usefixtures("one_thread", "on_device")

# levels whose expanded nodes are not their first ones, and picks with gaps
UNEVEN = StaticTree(((0,), (1,), (2,), (1, 0), (1, 2), (2, 1), (1, 2, 0), (1, 2, 1)))


def refuse_tolist(self, *args, **kwargs):
    raise AssertionError("tolist reads a tensor's values on the host")


def drafts_of(monkeypatch, kind=EagleDrafter, keep=lambda d: (list(d.tokens), d.tree)) -> list:
    """What ``keep`` takes of every draft a drafter of ``kind`` proposes from now on, in
    order (by default its tokens and tree)."""
    seen: list = []
    propose_all = kind.propose_all.__func__

    def spied(cls, drafters, contexts):
        drafts = propose_all(cls, drafters, contexts)
        seen.extend(keep(d) for d in drafts)
        return drafts

    monkeypatch.setattr(kind, "propose_all", classmethod(spied))
    return seen


def test_levels_are_planned_parents_first_with_their_rows():
    levels = Level.plan(UNEVEN.choices)
    assert [level.depth for level in levels] == [1, 2, 3]
    first, second, third = levels
    assert (first.width, first.picks, first.expanded, first.their_parents) == (
        3,
        [0, 1, 2],
        [1, 2],
        [0, 0],
    )
    # (1, 0), (1, 2), (2, 1): below (1,) and (2,), the first level's expanded rows 0, 1
    assert (second.width, second.picks, second.expanded, second.their_parents) == (
        3,
        [0, 2, 4],
        [1],
        [0],
    )
    assert second.before == 2 and second.seen.tolist() == [[True, False, True]]
    assert (third.width, third.picks, third.expanded, third.before) == (2, [0, 1], [], 3)


TREES = {
    "eagle-1": StaticTree(EAGLE1_TREE),
    "uneven": UNEVEN,
    "eagle-2 60/5/10": DynamicTree(total_tokens=60, depth=5, top_k=10),
    "dynamic 12/3/3": DynamicTree(total_tokens=12, depth=3, top_k=3),
}


@pytest.mark.parametrize("tree", TREES.values(), ids=TREES.keys())
def test_a_tree_is_one_step_with_the_eager_drafters_drafts(
    runners, head, tree, monkeypatch, same_greedy
):
    eager, fixed = runners
    vocabulary = DraftProjection(fixed.lm_head, list(range(3, 128, 2)))
    seen, proposals = drafts_of(monkeypatch), 0
    for projection in (None, vocabulary):
        for prompt in PROMPTS:
            seen.clear()
            alone = decode_speculative(eager, EagleDrafter(head, tree, projection), prompt, 40)
            expected = list(seen)
            seen.clear()
            drafter = EagleDrafter(head, tree, projection)
            result = decode_speculative(fixed, drafter, prompt, 40)
            same_greedy(fixed, prompt, result.tokens, decode_plain(eager, prompt, 40).tokens)
            assert drafter.trees is not None
            proposals += len(seen)
            if DEVICE == "cpu":  # a GPU's kernels, chosen per row count, may flip a near-tie
                assert seen == expected and result.accepted == alone.accepted
    trees = TreeSteps.of(EagleStep.of(head, fixed.static.how), fixed.embed)
    assert trees.calls == proposals > 20  # every proposal drafted its levels in one step


@pytest.mark.parametrize("tree", [UNEVEN, TREES["dynamic 12/3/3"]], ids=["static", "dynamic"])
def test_sequences_decoded_together_draft_their_trees_in_one_run(runners, head, tree, same_greedy):
    eager, fixed = runners
    prompts = [*PROMPTS[:2], [1, 22], [1, 100, 3, 3, 3, 100, 3]]
    run = decode_batch(fixed, prompts, 20, 4, lambda: EagleDrafter(head, tree))
    for prompt, result in zip(prompts, run.results, strict=True):
        same_greedy(fixed, prompt, result.tokens, decode_plain(eager, prompt, 20).tokens)
    trees = TreeSteps.of(EagleStep.of(head, fixed.static.how), fixed.embed)
    assert trees.batched[4] > 0


@torch.inference_mode()
@pytest.mark.parametrize("tree", [UNEVEN, TREES["dynamic 12/3/3"]], ids=["static", "dynamic"])
def test_the_tree_step_reads_nothing_back_to_the_host(runners, head, tree, monkeypatch):
    fixed = runners[1]
    decode_speculative(fixed, EagleDrafter(head, tree), PROMPTS[0], 12)
    trees = TreeSteps.of(EagleStep.of(head, fixed.static.how), fixed.embed)
    ((buffer, run),) = trees._steps.values()
    before = [tensor.clone() for tensor in buffer.tensors()]
    monkeypatch.setattr(torch.Tensor, "tolist", refuse_tolist)
    with NoHostReads():  # what a graph replays
        run()
    after = buffer.tensors()  # the same inputs, the same tree
    assert all(torch.equal(a, b) for a, b in zip(after, before))


@torch.inference_mode()
def test_a_refused_tree_is_drafted_level_by_level_from_the_roots_copy(runners, head):
    """A tree the step refuses comes back as copies of its root: the head call another
    sequence makes in the same round overwrites the step's outputs the root views."""
    fixed = runners[1]
    drafter, other = EagleDrafter(head, UNEVEN), EagleDrafter(head, UNEVEN)
    decode_speculative(fixed, drafter, PROMPTS[0], 8)
    decode_speculative(fixed, other, PROMPTS[1], 8)
    step, cache = drafter.step, drafter.cache
    assert step is not None and cache is not None
    projection = drafter.projection_for(fixed)
    both = step.forward([commit_rows(fixed, cache), commit_rows(fixed, other.cache)], projection)
    features, logits = both[0]  # the first lane's rows of the two lanes' buffers
    root = features.clone(), logits.clone()
    cache.give_back()  # off the step: refused
    tree = eagle_drafting._TreeCall(
        eagle_drafting.TreeCall(cache, 50, features, logits), drafter.trees, UNEVEN.choices
    )
    again = eagle_drafting._HeadCall(commit_rows(fixed, other.cache), projected=1, step=step)
    refused, _ = EagleDrafter.run_together(head, projection, [tree, again])
    assert isinstance(refused, eagle_drafting._HeadOut)
    assert torch.equal(refused.features, root[0]) and torch.equal(refused.logits, root[1])
    assert not torch.equal(features, root[0])  # the view was overwritten by the head call


def commit_rows(runner, cache):
    """One more committed pair's rows for ``cache`` (random features, token 5)."""
    from autotune.heads.eagle import HeadRows

    at = cache.lengths[0]
    features = torch.randn(1, runner.config.hidden_size, generator=torch.Generator(DEVICE))
    embeds = runner.embed(torch.tensor([5]))
    return HeadRows(features, embeds, torch.tensor([at]), cache)


def test_a_refused_recording_is_one_warning_and_the_same_tokens(
    runners, head, monkeypatch, capsys, same_greedy
):
    eager, fixed = runners
    trees = TreeSteps.of(EagleStep.of(head, fixed.static.how), fixed.embed)
    trees.recorder.how = "graph"  # as on a GPU

    def refuse(run):
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing")

    monkeypatch.setattr(trees.recorder, "_graph", refuse)
    for prompt in PROMPTS[:2]:
        for tree in (TREES["eagle-1"], TREES["dynamic 12/3/3"]):
            tokens = decode_speculative(fixed, EagleDrafter(head, tree), prompt, 30).tokens
            same_greedy(fixed, prompt, tokens, decode_plain(eager, prompt, 30).tokens)
    assert trees.recorder.failed is not None and trees.calls == 0
    said = " ".join(capsys.readouterr().err.split())
    assert said.count("warning:") == 1 and "EAGLE head's tree" in said
