"""Which Ray cluster study trials run on, checked before any long work. Imports no Ray
at import time.

Ray's own conventions, in its order: ``--ray-address``, else ``$RAY_ADDRESS``, else the
cluster that ``ray start`` left running on this machine, else a local instance that
autotune starts itself (the only case where autotune says how many cores Ray may use, and
one that listens on loopback only: ``local_instance_options``).
A given address is checked with a short connection attempt first: Ray itself would wait
for minutes, and print pages of log, before it gave up.
"""

from __future__ import annotations

import contextlib
import os
import socket
from dataclasses import dataclass
from typing import Any

from autotune.errors import AutotuneError

ENV_ADDRESS = "RAY_ADDRESS"
CONNECT_TIMEOUT_S = 5.0  # a reachable head answers a TCP connect in well under a second
GCS_TIMEOUT_S = 2.0  # and its GCS the cluster id (Ray tries three times: 6 s in all)
CLIENT_SCHEME = "ray://"  # Ray Client addresses: ray://host:10001
LOOPBACK = "127.0.0.1"  # the local instance's node address: no other machine reaches it


@dataclass(frozen=True)
class RayTarget:
    """Where ``ray.init`` connects: ``address`` None means start a local instance."""

    address: str | None
    source: str  # "--ray-address", "RAY_ADDRESS", "the running local cluster", "local"

    @property
    def local(self) -> bool:
        return self.address is None

    def local_options(self) -> dict[str, Any]:
        """``ray.init``'s keyword arguments for the local instance (see
        ``local_instance_options``)."""
        assert self.local, "a cluster is joined as it is: its nodes say their own options"
        return local_instance_options()


def local_instance_options() -> dict[str, Any]:
    """``ray.init``'s keyword arguments for the Ray instance autotune starts itself: this
    machine's cores and the GPUs torch sees here, every server of it (GCS, raylet,
    workers, the driver, Ray's agents) bound to loopback, no dashboard; ``ray.init``
    starts no Ray Client server. Only ``--ray-address`` or ``$RAY_ADDRESS`` joins a
    cluster that other machines can reach."""
    from autotune.hardware import cuda_count

    _single_machine()
    return {
        "address": "local",  # not a cluster file that `ray start` left behind
        "num_cpus": os.cpu_count(),
        # torch's count, not Ray's own: Ray counts GPUs by NVIDIA's management library,
        # which a container given the driver's compute part alone lacks while CUDA works;
        # it would count none there and refuse every trial that holds one
        "num_gpus": cuda_count(),
        "include_dashboard": False,
        "_node_ip_address": LOOPBACK,
    }


def _single_machine() -> None:
    """Ray binds its servers to the node's address, but takes 127.0.0.1 for "this node's
    routable address" unless clusters are off (``$RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER``, as
    Ray has them on macOS and Windows). Off in this process, whose Ray read that variable
    when it was imported: the processes it starts are given the node's address."""
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False


def ray_target(address: str | None = None) -> RayTarget:
    """The cluster to use, checked reachable (AutotuneError, one line, when it is not)."""
    given, source = (address or "").strip(), "--ray-address"
    if not given:
        given, source = os.environ.get(ENV_ADDRESS, "").strip(), ENV_ADDRESS
    if given == "local":
        return RayTarget(None, "local")
    if given and given != "auto":
        check_reachable(given, source)
        return RayTarget(given, source)
    running = _running_local_cluster()
    if running is not None and reachable(running):
        return RayTarget(running, "the running local cluster")
    if given == "auto":
        raise AutotuneError(
            f"{source} is 'auto' but no Ray cluster runs on this machine: start one with "
            "`ray start --head`, or give its HOST:PORT"
        )
    # a cluster file left by a `ray start` whose cluster has since died is not one to join
    return RayTarget(None, "local")


def host_port(address: str) -> tuple[str, int]:
    """``host:port``, ``[v6]:port`` or ``ray://host:port`` as (host, port)."""
    rest = address.strip().removeprefix(CLIENT_SCHEME)
    host, sep, port = rest.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(address)
    return host, int(port)


def reachable(address: str) -> bool:
    try:
        return _unreachable(address) is None
    except ValueError:
        return False


def check_reachable(address: str, source: str = "--ray-address") -> None:
    """Fail in one line, within seconds, unless a Ray head node answers there."""
    try:
        reason = _unreachable(address)
    except ValueError:
        raise AutotuneError(
            f"{source} {address!r} is not a Ray address: write it as HOST:PORT (the head "
            "node's GCS port, 6379 by default) or ray://HOST:PORT"
        ) from None
    if reason is None:
        return
    unset = f" (or unset {ENV_ADDRESS} to start a local instance)" if source == ENV_ADDRESS else ""
    raise AutotuneError(
        f"cannot reach the Ray cluster at {address} ({source}): {reason}; start it with "
        f"`ray start --head`, or fix {source}{unset}"
    )


def _unreachable(address: str) -> str | None:
    """Why no Ray head answers at ``address``; None when one does. ValueError: not an
    address. Ray itself would retry for minutes, logging each try, before it gave up."""
    host, port = host_port(address)
    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        return "no answer" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc))
    if address.strip().startswith(CLIENT_SCHEME):
        return None  # a Ray Client server: ray.init's own error is short
    return _not_a_gcs(address.strip())


def _not_a_gcs(address: str) -> str | None:
    """Ask the head node's GCS for the cluster id, with a short timeout. Uses a private
    helper of Ray's; without it, the TCP check above is all there is."""
    try:
        import ray._raylet

        standalone = ray._raylet.InnerGcsClient.standalone  # type: ignore[attr-defined]
    except (ImportError, AttributeError):
        return None
    try:
        with _quiet_stderr():  # Ray's C++ client logs each failed try on stderr
            standalone(address, None, int(GCS_TIMEOUT_S * 1000))
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
        return f"something answers there, but not a Ray head node ({first})"
    return None


@contextlib.contextmanager
def _quiet_stderr():
    """File descriptor 2 to /dev/null for a moment: a C++ library writes there directly."""
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _running_local_cluster() -> str | None:
    """The address that `ray start` recorded on this machine, if any (Ray's own lookup)."""
    try:
        from ray._private.utils import read_ray_address

        return read_ray_address(None) or None
    except Exception:  # a private helper of Ray's: without it, start a local instance
        return None
