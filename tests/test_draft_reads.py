"""Drafts read back to the host once they are complete: on a GPU every read of a
tensor's value waits for the device, which then idles while the host decides and sends
the next call. A drafter whose next call follows from the last one's top-k on the device
(EAGLE's trees; a chain no exit rule can cut short) reads its draft once."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from autotune.drafters.eagle import EAGLE1_TREE, DynamicTree, EagleDrafter, StaticTree
from autotune.drafters.glide import GlideDrafter
from autotune.drafters.self_spec import DraftExitPolicy, LayerSkipDrafter
from autotune.engine import staging
from autotune.engine.decoding import decode_plain, decode_speculative
from autotune.engine.runner import Runner
from autotune.engine.skip import SkipMask
from autotune.training.glide import new_draft

PROMPT = [1, 70, 3, 3, 3, 90, 12, 8, 77]

pytestmark = pytest.mark.usefixtures("one_thread")


class Reads(TorchDispatchMode):
    """Counts reads of a tensor's values back to the host (on a GPU, each waits for the
    device): scalar reads, as dispatched, and ``tolist`` and ``staging.read_back``
    (``counting`` adds them: on a CPU the one dispatches nothing, the other a copy)."""

    def __init__(self):
        super().__init__()
        self.count, self.reading = 0, False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in (torch.ops.aten.item, torch.ops.aten._local_scalar_dense):
            self.count += 1
        return func(*args, **(kwargs or {}))

    def counting(self, monkeypatch) -> Reads:
        tolist = torch.Tensor.tolist

        def counted(tensor):
            self.count += not self.reading  # once, where a torch mode calls it again
            reading, self.reading = self.reading, True
            try:
                return tolist(tensor)
            finally:
                self.reading = reading

        monkeypatch.setattr(torch.Tensor, "tolist", counted)
        monkeypatch.setattr(staging, "read_back", self._counted_back(staging.read_back))
        return self

    def _counted_back(self, read_back):
        def counted(values):
            self.count += 1
            return read_back(values)

        return counted


def reads_per_draft(runner, drafter_class, *args, **kwargs) -> tuple[list[int], list[list[int]]]:
    """The reads of each proposal of a greedy decoding of ``PROMPT`` with a drafter of
    ``drafter_class``, and its drafts; its output is checked against plain greedy's."""
    counted, per_draft, drafts = Reads(), [], []

    class Counted(drafter_class):
        def propose(self, context):
            before = counted.count
            with counted:
                draft = super().propose(context)
            per_draft.append(counted.count - before)
            drafts.append(draft.tokens)
            return draft

    with pytest.MonkeyPatch.context() as patch:
        counted.counting(patch)
        spec = decode_speculative(runner, Counted(*args, **kwargs), PROMPT, 24)
    assert spec.tokens == decode_plain(runner, PROMPT, 24).tokens
    return per_draft, drafts


@pytest.mark.parametrize(
    "tree, width, reads",
    [
        (StaticTree(EAGLE1_TREE), 0, 1),
        (StaticTree(((0,), (0, 0), (0, 0, 0))), 3, 1),  # the ranked tokens stay on the device
        (DynamicTree(total_tokens=20, depth=3, top_k=4), 0, 2),  # tokens and parents; scores
    ],
    ids=["static tree", "ranked chain", "dynamic tree"],
)
@pytest.mark.parametrize("static", [False, True], ids=["eager", "fixed-shape steps"])
def test_an_eagle_draft_is_read_back_once(
    tiny_llama, random_eagle_head, tree, width, reads, static
):
    """The head's calls take their tokens from the last call's top-k on the device, and
    the draft's tokens are the same. Read per parent and per expansion, these drafts
    took 11, 3 and 8 reads."""
    runner = Runner(tiny_llama, static=static)
    head = random_eagle_head(tiny_llama)
    per_draft, _ = reads_per_draft(runner, EagleDrafter, head, tree, ranked_width=width)
    assert per_draft and set(per_draft) == {reads}


@pytest.mark.parametrize("kind", ["layer-skip", "glide"])
@pytest.mark.parametrize("static", [False, True], ids=["eager", "fixed-shape steps"])
def test_a_chain_no_exit_can_cut_short_is_read_back_once(tiny_llama, kind, static):
    """A fixed exit threshold of 0: every step's token goes to the next step on the
    device. The same chains, read at every step, where the threshold is a hair above 0
    (which no step's probability falls below either)."""
    runner = Runner(tiny_llama, static=static)
    torch.manual_seed(0)
    model = SkipMask.of(attention=[1]) if kind == "layer-skip" else new_draft(tiny_llama, 1).eval()
    drafter = LayerSkipDrafter if kind == "layer-skip" else GlideDrafter
    once, drafts = reads_per_draft(runner, drafter, model, DraftExitPolicy(4, 0.0, None))
    each_step, same = reads_per_draft(runner, drafter, model, DraftExitPolicy(4, 1e-30, None))
    assert set(once) == {1} and max(each_step) == 4
    assert same == drafts
