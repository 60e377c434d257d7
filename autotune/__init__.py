"""autotune: speculative-decoding settings fitted to your model, hardware and workload."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("autotune")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"
