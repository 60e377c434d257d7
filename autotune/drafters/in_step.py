"""Several sequences' drafting run in step, so that their draft forwards batch.

A drafter kind that runs forwards to draft (the target with layers skipped, EAGLE's head,
GLIDE's draft model) writes one proposal as a generator: it yields each forward it needs
(a call: its rows) and is sent that forward's output, then returns its draft.
``run_in_step`` runs the generators of the sequences decoded together round by round;
each round, the calls that can share a forward (the same module) run as one. One proposal
alone is the one-generator case, so single-sequence and batched drafting are the same
code.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Generator, Hashable
from typing import Any, TypeVar, cast

import torch

from autotune.engine.proposal import ChainDrafter, Draft, DraftContext, Drafter
from autotune.heads.eagle import DraftProjection

Call = TypeVar("Call")
Out = TypeVar("Out")
Result = TypeVar("Result")


def run_in_step(
    steps: list[Generator[Call, Out, Result]],
    key: Callable[[int], Hashable],
    run: Callable[[list[int], list[Call]], list[Out]],
) -> list[Result]:
    """Each generator's result. ``key(i)``: which calls of generator i may share a
    forward; ``run(indices, calls)``: one forward for those generators' calls, an output
    per call."""
    results: dict[int, Result] = {}
    waiting: dict[int, Call] = {}

    def advance(index: int, output: Out | None) -> None:
        try:
            waiting[index] = steps[index].send(output)  # type: ignore[arg-type]
        except StopIteration as done:
            results[index] = done.value

    for index in range(len(steps)):
        advance(index, None)
    while waiting:
        current, groups = dict(waiting), dict[Hashable, list[int]]()
        waiting.clear()
        for index in current:
            groups.setdefault(key(index), []).append(index)
        for indices in groups.values():
            for index, output in zip(indices, run(indices, [current[i] for i in indices])):
                advance(index, output)
    return [results[i] for i in range(len(steps))]


def run_by_kind(calls: list, runs: list[tuple[type, Callable[[list], list]]]) -> list:
    """Each call's output: the calls of each kind (a class) run together by its run, kind
    after kind in the order given (a drafter whose one-step drafts copy the outputs of
    its head's step puts them first, before that step runs again)."""
    outputs: list = [None] * len(calls)
    for kind, run in runs:
        indices = [i for i, call in enumerate(calls) if isinstance(call, kind)]
        if indices:
            for i, out in zip(indices, run([calls[i] for i in indices])):
                outputs[i] = out
    return outputs


class InStepDrafter(ChainDrafter):
    """A drafter whose proposal is a generator of calls to its draft model (``drafting``),
    each call's output projected to draft logits: proposals of several sequences run in
    step, drafters with one draft model and projection sharing each forward."""

    @property
    @abstractmethod
    def model(self) -> Any:
        """The module its calls run (an EAGLE head, a GLIDE draft)."""

    @abstractmethod
    def projection_for(self, runner: Any) -> DraftProjection:
        """The projection of its outputs to draft logits."""

    @abstractmethod
    def drafting(self, context: DraftContext) -> Generator[Any, Any, Draft]:
        """One proposal: yields each call, is sent its output, returns the draft."""

    @staticmethod
    @abstractmethod
    def run_together(model: Any, projection: DraftProjection, calls: list) -> list:
        """Several sequences' calls as one forward of ``model``: an output per call."""

    def propose(self, context: DraftContext) -> Draft:
        return self.propose_all([self], [context])[0]

    @classmethod
    def propose_all(cls, drafters: list[Drafter], contexts: list[DraftContext]) -> list[Draft]:
        own = cast(list[InStepDrafter], drafters)  # ``propose_all`` is called per kind
        with torch.inference_mode():
            projections = [d.projection_for(c.runner) for d, c in zip(own, contexts)]
            return run_in_step(
                [d.drafting(c) for d, c in zip(own, contexts)],
                key=lambda i: (id(own[i].model), id(projections[i].linear)),
                run=lambda indices, calls: cls.run_together(
                    own[indices[0]].model, projections[indices[0]], calls
                ),
            )
