"""Several sequences' drafting run in step, so that their draft forwards batch.

A drafter kind that runs forwards to draft (EAGLE's head, GLIDE's draft model) writes one
proposal as a generator: it yields each forward it needs (a call: its rows) and is sent
that forward's output, then returns its draft. ``run_in_step`` runs the generators of
the sequences decoded together round by round; each round, the calls that can share a
forward (the same module) run as one. One proposal alone is the one-generator case, so
single-sequence and batched drafting are the same code.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Hashable
from typing import TypeVar

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
