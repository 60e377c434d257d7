"""Progress bars with an ETA for every long step (on stderr, so --json stays clean)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

console = Console(stderr=True)


@contextlib.contextmanager
def step(label: str, total: int) -> Iterator[Callable[..., None]]:
    """Yields ``advance(n=1)``."""
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        console=console,
    )
    task = bar.add_task(label, total=total)
    with bar:
        yield lambda n=1: bar.advance(task, n)


def say(message: str) -> None:
    console.print(message)
