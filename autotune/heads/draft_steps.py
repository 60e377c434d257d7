"""What a drafter's whole-draft steps keep: the EAGLE head's trees (``heads.tree_step``)
and GLIDE's greedy chains (``heads.glide_chain``), each the rest of a proposal after its
commit call in one recorded run.

Such a step runs in the storage its drafter's own step lends (lane by lane), so it is
made per count of lanes, shape of draft and draft projection, recorded at its first call
(``engine.capture``) and dropped when a storage it reads is replaced; the few most
recently used are kept (a search tries a new shape every trial). A subclass says where
its calls go (``fits``), makes a shape's buffers and step (``make``), and reads the draft
back from the buffers.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Hashable
from typing import Any, Generic, TypeVar

import torch
from torch import nn

from autotune.engine import buckets
from autotune.engine.capture import Recorder, Run
from autotune.engine.static_cache import LaneStorage, StaticCache
from autotune.heads.eagle import DraftProjection

# shapes whose steps are kept: a decoding drafts one, a search tries a new one a trial
KEPT_SHAPES = 4

# Calls placed in the storage: each one's cache (its lane) and its entries before the draft
Placed = list[tuple[StaticCache, int]]
Shape = TypeVar("Shape", bound=Hashable)  # what a step drafts: a tree, a chain's length
Steps = TypeVar("Steps", bound="DraftSteps")


class DraftSteps(Generic[Shape]):
    """A drafter's whole-draft steps (see the module's docstring). ``embed``: the token
    embedding the steps draft with; ``how``: as the drafter's own step records."""

    title = "a whole draft"
    kept_as = "_autotune_draft_steps"  # the attribute of the drafter's step that keeps them

    def __init__(self, device: torch.device, how: str, embed: nn.Embedding):
        self.recorder, self.embed = Recorder(device, how), embed
        self._steps: collections.OrderedDict[tuple, tuple[Any, Run]] = collections.OrderedDict()
        self._versions: Any = None
        self.calls = 0  # drafts made here (the tests read it)
        self.batched: collections.Counter[int] = collections.Counter()  # sequences > 1

    @classmethod
    def of(cls: type[Steps], step: Any, embed: nn.Embedding) -> Steps:
        """The steps over ``step``'s storages (the drafter's own step), tokens embedded by
        ``embed``, made once and kept on ``step``: each decoding makes a new drafter, and
        the recorded steps outlive it."""
        found = getattr(step, cls.kept_as, None)
        if not isinstance(found, cls) or found.embed is not embed:
            found = cls(step, embed)  # type: ignore[call-arg]  # the subclasses' signature
            setattr(step, cls.kept_as, found)
        return found

    @property
    def scratch(self) -> int:
        """The scratch column of every lane of the storage the drafts are written to."""
        raise NotImplementedError

    def versions(self) -> Any:
        """The versions of the storages the steps read and write."""
        raise NotImplementedError

    def make(
        self, lanes: int, shape: Shape, projection: DraftProjection
    ) -> tuple[Any, functools.partial, list[torch.Tensor], str]:
        """A shape's buffers, its step over them, every tensor the step reads or writes
        besides the models' parameters, and its name for a warning."""
        raise NotImplementedError

    def placed(self, caches: list, storage: LaneStorage, rows: int) -> Placed | None:
        """Each cache and its entries, or None unless every one is the live borrower of its
        own lane of ``storage``, at one length in every layer, with room for ``rows`` more
        before the scratch column."""
        placed: Placed = []
        for cache in caches:
            if not isinstance(cache, StaticCache) or not storage.holds(cache):
                return None
            if any(cache.lane == other.lane for other, _ in placed):
                return None
            if len(set(cache.lengths)) != 1 or cache.lengths[0] + rows > self.scratch:
                return None
            placed.append((cache, cache.lengths[0]))
        return placed

    def run(self, calls: list, placed: Placed, shape: Shape, projection: DraftProjection):
        """The step of ``shape`` over ``calls`` (``placed``: each one's cache and entries
        before the draft), loaded and run; its buffers, or None where the recording was
        refused (said once: the drafter drafts a call at a time)."""
        if self.recorder.failed is not None:
            return None
        lanes = buckets.lanes_for(max(cache.lane for cache, _ in placed))
        made = self._step_for(lanes, shape, projection)
        if made is None:
            return None
        buffer, step = made
        laid = [(call, cache.lane, prefix) for call, (cache, prefix) in zip(calls, placed)]
        buffer.load(laid, self.scratch)
        step()
        self.calls += 1
        if len(calls) > 1:
            self.batched[len(calls)] += 1
        return buffer

    def _step_for(
        self, lanes: int, shape: Shape, projection: DraftProjection
    ) -> tuple[Any, Run] | None:
        """The step over ``lanes`` lanes, made (on CUDA: recorded) at its first call; the
        least recently used past ``KEPT_SHAPES`` go."""
        versions = self.versions()
        if self._versions != versions:  # a storage was replaced
            self._versions = versions
            self._steps.clear()
            self.recorder.forget()
        key = (lanes, shape, projection.linear)
        if key in self._steps:
            self._steps.move_to_end(key)
            return self._steps[key]
        buffer, step, statics, what = self.make(lanes, shape, projection)
        buffer.load_idle(self.scratch)  # recording writes the scratch columns only
        statics += [projection.linear.weight, self.embed.weight]
        if projection.ids is not None:
            statics.append(projection.ids)
        lanes_said = f" over {lanes} sequences" if lanes > 1 else ""
        run = self.recorder.make(step, statics, f"{self.title}'s {what} step{lanes_said}")
        if run is None:
            return None
        self._steps[key] = (buffer, run)
        while len(self._steps) > KEPT_SHAPES:
            self._steps.popitem(last=False)
        return buffer, run
