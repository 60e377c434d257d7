"""Where study trials run: how many at once, and what each reserves. Imports no Ray."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Workers:
    """Where trials run: ``count`` at once (at most), each reserving ``cpus_per_trial``
    cores and ``gpus_per_trial`` GPUs, on a local Ray instance sized to this machine or
    on the cluster at ``ray_address``. See ``trial_resources`` for the defaults."""

    count: int = 1
    cpus_per_trial: float | None = None
    gpus_per_trial: float = 0.0
    ray_address: str | None = None


def trial_resources(workers: Workers, timed: bool, nodes: list[dict]) -> tuple[dict, int]:
    """What one trial reserves, and how many trials run at once, on these Ray nodes
    (each a resource dict: {"CPU": 8, "GPU": 1, ...}).

    The rule: a trial that times wall clock on CPU reserves every core of the largest
    node, so no two timed trials share a machine (one timed trial per machine; it runs
    ``StudySpec.threads`` torch threads, as the main process does); with GPUs, each trial
    has its GPUs to itself and one core. A trial that does not time (a proxy objective)
    gets an equal share of the largest node, and as many torch threads.
    ``--cpus-per-trial`` overrides the cores.
    """
    largest = max((n.get("CPU", 0.0) for n in nodes), default=1.0) or 1.0
    gpus = workers.gpus_per_trial
    if workers.cpus_per_trial is not None:
        cpus = workers.cpus_per_trial
    elif gpus:
        cpus = 1.0
    elif timed:
        cpus = largest
    else:
        cpus = max(1.0, float(largest // max(1, workers.count)))
    cpus = min(cpus, largest)
    capacity = sum(int(n.get("CPU", 0.0) // cpus) for n in nodes) if cpus else workers.count
    if gpus:
        capacity = min(capacity, sum(int(n.get("GPU", 0.0) // gpus) for n in nodes))
    resources = {"cpu": cpus, "gpu": gpus} if gpus else {"cpu": cpus}
    return resources, max(1, min(workers.count, capacity))
