"""The Ray instance autotune starts itself listens on loopback only: its GCS, raylet,
workers, agents and the driver's own server (autotune.studies.cluster.local_instance_options);
no dashboard and no Ray Client server. A cluster is joined only when asked for."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

import pytest

from autotune.studies import cluster

LISTEN = "0A"  # a socket's state in /proc/net/tcp: listening


def test_the_local_instance_options_bind_loopback_without_a_dashboard(monkeypatch):
    from ray._private import ray_constants

    monkeypatch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", ray_constants.ENABLE_RAY_CLUSTER)
    options = cluster.RayTarget(None, "local").local_options()
    assert options["_node_ip_address"] == "127.0.0.1" and options["include_dashboard"] is False
    assert options["address"] == "local" and options["num_cpus"] == os.cpu_count()
    # Ray takes 127.0.0.1 for "this node's routable address" unless clusters are off
    assert ray_constants.ENABLE_RAY_CLUSTER is False
    with pytest.raises(AssertionError):
        cluster.RayTarget("10.0.0.1:6379", "--ray-address").local_options()


def listening() -> set[tuple[str, int, str]]:
    """(address, port, process) of every listening TCP socket of this process and the
    processes it started, theirs included."""
    try:
        import psutil
    except ImportError:
        return _listening_from_proc()
    me = psutil.Process()
    found = set()
    for process in [me, *me.children(recursive=True)]:
        try:
            for conn in process.net_connections(kind="tcp"):
                if conn.status == psutil.CONN_LISTEN:
                    found.add((conn.laddr.ip, conn.laddr.port, process.name()))
        except psutil.Error:  # a worker that exited meanwhile
            continue
    return found


def _listening_from_proc() -> set[tuple[str, int, str]]:
    """The same from /proc: listening sockets by inode, matched to the file descriptors
    of this process and its descendants."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    ours, grown = {os.getpid()}, True
    while grown:
        more = {pid for pid, parent in parents.items() if parent in ours} - ours
        ours |= more
        grown = bool(more)
    owner = {}
    for pid in ours:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    owner[target[8:-1]] = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == LISTEN and inode in owner:
                address, port = local.split(":")
                found.add((_proc_address(address), int(port, 16), owner[inode]))
    return found


def _proc_address(hex_address: str) -> str:
    """/proc/net/tcp{,6} write addresses as 32-bit words in host (little-endian) order."""
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(words))


def loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%")[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # ::ffff:127.0.0.1, a dual-stack socket bound to loopback
    return ip.is_loopback


def test_proc_addresses_decode():
    assert _proc_address("0100007F") == "127.0.0.1"
    assert _proc_address("00000000") == "0.0.0.0"
    mapped = ipaddress.ip_address(_proc_address("0000000000000000FFFF00000100007F"))
    assert mapped == ipaddress.ip_address("::ffff:127.0.0.1")
    assert not loopback("::") and not loopback("0.0.0.0") and not loopback("192.0.2.2")
    assert loopback("::ffff:127.0.0.1") and loopback("::1")


@pytest.mark.ray
def test_the_local_instance_listens_on_loopback_only(monkeypatch):
    import ray
    from ray._private import ray_constants

    from autotune.studies.tune import init_ray

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(cluster, "_running_local_cluster", lambda: None)  # start our own
    monkeypatch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", ray_constants.ENABLE_RAY_CLUSTER)
    if ray.is_initialized():
        ray.shutdown()
    init_ray(None)
    try:

        @ray.remote
        class Counter:  # an actor: a worker process with a server of its own
            def add(self, n: int) -> int:
                return n + 1

        counter = Counter.remote()  # type: ignore[attr-defined]
        assert ray.get(counter.add.remote(1)) == 2
        assert ray.get([ray.remote(lambda: 1).remote() for _ in range(2)]) == [1, 1]
        sockets = listening()
        names = {name for _, _, name in sockets}
        assert "gcs_server" in names and "raylet" in names  # what the check looks at
        exposed = sorted(s for s in sockets if not loopback(s[0]))
        # the fallback without psutil reads the same sockets from /proc
        assert {p for _, p, _ in _listening_from_proc()} >= {p for _, p, _ in sockets}
        assert exposed == [], f"listening beyond loopback: {exposed}"
        assert not any(port in (8265, 10001) for _, port, _ in sockets)  # dashboard, client
        assert ray._private.worker.global_worker.node.node_ip_address == "127.0.0.1"
    finally:
        ray.shutdown()
