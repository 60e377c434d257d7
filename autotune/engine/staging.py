"""A fixed-shape step's small inputs (tokens, positions, columns, masks), written on the
host and sent to the device in one copy a call.

A recorded step replays fast, but what runs around it does not: on a GPU every copy or
fill into a step's buffers is a kernel launch, and every tensor made on the device from
a Python list a copy that waits for the device. Loading a decode step that way took ten
device operations besides the replay (``tests/test_static_step.py`` counts them; the GPU
check's greedy step times a decode step beside its replay alone). Here the inputs are
views of one byte buffer on the device, each with a twin on the host (pinned memory on
a GPU, so that the copy does not wait): the step's loader writes the twins with numpy,
and ``send`` copies the whole buffer in one operation. Values a caller made on the
device are copied there after it, never read back."""

from __future__ import annotations

import math

import numpy as np
import torch

# the dtypes an input may have, and numpy's for its host twin; the 8-byte ones are laid
# out first, so that every view of the byte buffer is aligned
_NUMPY = {torch.long: np.int64, torch.bool: np.bool_}


class HostInputs:
    """Named inputs (``fields``: name -> (shape, dtype)) as views of one device buffer
    (``device``) and their host twins (``host``), sent together by ``send``."""

    def __init__(
        self, fields: dict[str, tuple[tuple[int, ...], torch.dtype]], device: torch.device
    ):
        layout = sorted(fields.items(), key=lambda item: -item[1][1].itemsize)
        total = sum(math.prod(shape) * dtype.itemsize for shape, dtype in fields.values())
        pinned = device.type == "cuda"
        self._sent = torch.zeros(total, dtype=torch.uint8, device=device)
        # the twin's device said outright: a caller's torch.set_default_device must not
        # move it (nor pinning it fail)
        self._staged = torch.zeros(total, dtype=torch.uint8, device="cpu", pin_memory=pinned)
        staged_bytes = self._staged.numpy()
        self.device: dict[str, torch.Tensor] = {}
        self.host: dict[str, np.ndarray] = {}
        offset = 0
        for name, (shape, dtype) in layout:
            end = offset + math.prod(shape) * dtype.itemsize
            self.device[name] = self._sent[offset:end].view(dtype).view(shape)
            self.host[name] = staged_bytes[offset:end].view(_NUMPY[dtype]).reshape(shape)
            offset = end
        self._later: list[tuple[torch.Tensor, torch.Tensor]] = []  # (device view, values)
        # marks the last send: the host twins are not written again before it has read them
        self._read = torch.cuda.Event() if pinned else None

    def put(self, name: str, index, values: torch.Tensor) -> None:
        """``values`` into input ``name`` at ``index``: into its host twin where they are
        on the host, else (on the device) queued to be copied after the next ``send``."""
        if on_host(values):
            self.host[name][index] = values.numpy()
        else:
            self._later.append((self.device[name][index], values))

    def writable(self) -> dict[str, np.ndarray]:
        """The host twins, once the last ``send`` has read them (at once on a CPU)."""
        if self._read is not None:
            self._read.synchronize()
        return self.host

    def send(self) -> None:
        """Every host twin into its device view: one copy, queued on the current stream
        (the step that reads them is queued after it); then the values ``put`` left on
        the device."""
        self._sent.copy_(self._staged, non_blocking=self._read is not None)
        if self._read is not None:  # on the copy's stream, whichever GPU is current
            self._read.record(torch.cuda.current_stream(self._sent.device))
        for view, values in self._later:
            view.copy_(values)
        self._later.clear()


def on_host(values: torch.Tensor) -> bool:
    """Whether ``values`` can be written into a host twin as they are (the tests make
    this False to run a GPU caller's path, values on the device, on a CPU)."""
    return values.device.type == "cpu"


def sent(values: list[int] | torch.Tensor, device: torch.device) -> torch.Tensor:
    """``values`` (a list of ints, or a host tensor) on ``device``, without waiting for
    the device. ``torch.tensor(values, device=gpu)`` waits for every operation queued
    before it (a blocking copy synchronises its stream); from the host's pageable
    memory a non-blocking copy is staged at once, and waits for none."""
    made = values if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=torch.long)
    return made if device.type == "cpu" else made.to(device, non_blocking=True)


def read_back(values: torch.Tensor) -> np.ndarray:
    """``values`` as a numpy array of the host's own (one copy, which waits for the device
    to write them): what a step wrote is read in one go, without making a Python object
    for every value as ``tolist`` does (EAGLE-2's tree reads 1,530 a draft)."""
    if values.device.type == "cpu":  # the host's already: a copy that outlives the buffer
        return values.detach().numpy().copy()
    return values.detach().cpu().numpy()


class FedTokens:
    """The tokens a step feeds itself from run to run (``StaticStep.decode_fed``), read
    back one by one without waiting for the runs queued after each: after every run,
    its token is copied to the host on the same stream (into pinned memory, not waited
    for) and an event marks it; reading a token waits for its event alone."""

    def __init__(self, history: torch.Tensor, count: int):
        self.history = history  # [columns] on the device: the token of run i at i
        self.queued = 0
        on_gpu = history.device.type == "cuda"
        self._host = torch.zeros(count, dtype=torch.long, device="cpu", pin_memory=on_gpu)
        self._values = self._host.numpy()
        # two in turn: a token's event is waited for before the run two after it is queued
        self._events = [torch.cuda.Event(), torch.cuda.Event()] if on_gpu else None

    def queue(self) -> None:
        """After the next run is queued: its token's copy to the host, queued behind it."""
        i = self.queued
        self._host[i : i + 1].copy_(self.history[i : i + 1], non_blocking=True)
        if self._events is not None:
            self._events[i % 2].record(torch.cuda.current_stream(self.history.device))
        self.queued += 1

    def read(self, i: int) -> int:
        """Run ``i``'s token (queued already), once its copy has landed."""
        if self._events is not None:
            self._events[i % 2].synchronize()
        return int(self._values[i])

    def finish(self) -> None:
        """Wait for every run queued (the last copy is queued behind them all)."""
        if self._events is not None and self.queued:
            self._events[(self.queued - 1) % 2].synchronize()
