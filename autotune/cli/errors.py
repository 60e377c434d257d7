"""How a command's failures reach the user: one line each, never a traceback."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import wraps
from typing import Any, NoReturn

import click
import typer

from autotune.commands import interrupt
from autotune.errors import AutotuneError
from autotune.paths import cache_root


def user_errors(command: Callable[..., Any]) -> Callable[..., Any]:
    """No traceback reaches the user. An AutotuneError is theirs to fix: one line, exit
    status 2. Ctrl-C or SIGTERM: one line, status 130, saying what is true of this command
    (``commands.interrupt``: what it removed, what is kept). Running out
    of memory: one line with what to try, status 2. Anything else is a bug of ours: one
    line naming the log file that holds the traceback, status 1."""

    @wraps(command)
    def run(*args, **kwargs):
        interruption = None
        try:
            with interrupt.command() as interruption, _sigterm_as_interrupt():
                return command(*args, **kwargs)
        except (typer.Exit, typer.Abort, click.ClickException):
            raise  # the command's own exit, or click's usage error: already said
        except AutotuneError as exc:
            _fail(f"error: {exc}", 2)
        except KeyboardInterrupt:
            _fail((interruption or interrupt.Interruption()).message(), 130)
        except MemoryError as exc:
            _fail(
                f"error: out of memory ({exc or 'the machine'}): try a smaller model, "
                "--dtype bfloat16 or float16, fewer --workers, or a machine with more "
                "memory",
                2,
            )
        except Exception as exc:
            if type(exc).__name__ == "OutOfMemoryError":  # torch.cuda's
                _fail(
                    f"error: out of GPU memory ({str(exc).splitlines()[0][:160]}): try "
                    "--dtype float16, a smaller model or fewer --workers",
                    2,
                )
            log = _write_log(exc)
            _fail(
                f"error: autotune failed unexpectedly ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0][:200] if str(exc) else 'no message'}); this is a "
                f"bug: the details are in {log}, please report it",
                1,
            )

    return run


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (``kill``, a scheduler ending a job) stops a command as Ctrl-C does: the
    same cleanup (``finally`` blocks, temporary files removed) and the same message."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set signal handlers
        return
    # Ray's own handler would print its stack first and abort the exit after our line;
    # Ray reads this once, when first imported, which may come before it is started
    os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
    before = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield
    except SystemExit as exc:
        # ray.init() puts its own handler in place of ours, sys.exit(signum): the same stop
        if exc.code == signal.SIGTERM and signal.getsignal(signal.SIGTERM) is not _raise_interrupt:
            raise KeyboardInterrupt from None
        raise
    finally:
        signal.signal(signal.SIGTERM, before if before is not None else signal.SIG_DFL)


def _fail(line: str, status: int) -> NoReturn:
    typer.echo(line, err=True)
    raise typer.Exit(status)


def _write_log(exc: BaseException) -> str:
    """The traceback of an unexpected failure, in a file of its own."""
    text = "".join(traceback.format_exception(exc))
    try:
        folder = cache_root() / "logs"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"autotune-{time.strftime('%Y%m%d-%H%M%S')}-{id(exc):x}.log"
        path.write_text(f"autotune {' '.join(sys.argv[1:])}\n\n{text}")
        return str(path)
    except OSError:
        return "(no log: the cache folder is not writable)"
