"""Errors a user can act on. The CLI prints them as one line and exits non-zero."""

from __future__ import annotations

import sys
from collections.abc import Callable


class AutotuneError(Exception):
    """Base of every error caused by input the user can fix; the message says how."""


class ModelNotFoundError(AutotuneError):
    pass


class ModelConfigError(AutotuneError):
    """A model folder's config.json cannot be read."""


class PromptsFileError(AutotuneError):
    pass


class StorageError(AutotuneError):
    pass


class OutputPathError(AutotuneError):
    pass


class StudyNotFoundError(AutotuneError):
    pass


def exit_status(main: Callable[[], int]) -> int:
    """``main()``'s exit status, an error the user can fix said in one line (status 2): for
    the scripts outside the CLI (``benchmarks/``)."""
    try:
        return main()
    except AutotuneError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
