"""Errors a user can act on. The CLI prints them as one line and exits non-zero."""


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
