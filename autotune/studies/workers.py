"""Where study trials run: how many at once, and what each reserves. Imports no Ray."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from autotune.errors import AutotuneError


@dataclass(frozen=True)
class Workers:
    """Where trials run: ``count`` at once (at most), each reserving ``cpus_per_trial``
    cores and ``gpus_per_trial`` GPUs, on a local Ray instance sized to this machine or
    on the cluster at ``ray_address``. See ``trial_resources`` for the defaults."""

    count: int = 1
    cpus_per_trial: float | None = None
    gpus_per_trial: float | None = None  # None: as ``on_device`` decides
    ray_address: str | None = None

    def on_device(self, device: str) -> Workers:
        """These workers for a model on ``device``, the GPUs a trial reserves decided:
        those asked for, else one where the model runs on a GPU (Ray hides every GPU from
        a trial that reserves none, so it could not load the model), else none."""
        if self.gpus_per_trial is not None:
            return self
        return dataclasses.replace(self, gpus_per_trial=1.0 if device.startswith("cuda") else 0.0)


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
    gpus = workers.gpus_per_trial or 0.0
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
        on_gpus = sum(int(n.get("GPU", 0.0) // gpus) for n in nodes)
        capacity = min(capacity, on_gpus)
        if on_gpus == 0:  # Ray would wait for a GPU that never comes
            most = max((n.get("GPU", 0.0) for n in nodes), default=0.0)
            raise AutotuneError(
                f"--gpus-per-trial {gpus:g}: no node of the Ray cluster has that many GPUs "
                f"(the most on one node: {most:g}); ask for fewer, or join a cluster with GPUs"
            )
    resources = {"cpu": cpus, "gpu": gpus} if gpus else {"cpu": cpus}
    return resources, max(1, min(workers.count, capacity))


def check_trial_gpus(gpus_per_trial: float | None, device: str) -> None:
    """Fail at once when trials would reserve GPUs the model does not run on: on a machine
    without one, a local Ray instance would otherwise wait for them for minutes."""
    if not gpus_per_trial or device.startswith("cuda"):
        return
    from autotune.hardware import cuda_count

    if cuda_count() == 0:
        raise AutotuneError(
            f"--gpus-per-trial {gpus_per_trial:g}: torch sees no CUDA GPU on this machine; "
            "leave --gpus-per-trial out (trials then run on the CPU), or run on a GPU machine"
        )
    raise AutotuneError(
        f"--gpus-per-trial {gpus_per_trial:g} reserves GPUs that --device {device} does not "
        "use: pass --device cuda (or auto), or leave --gpus-per-trial out"
    )
