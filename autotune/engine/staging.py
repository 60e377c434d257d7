"""A fixed-shape step's small inputs (tokens, positions, columns, masks), written on the
host and sent to the device in one copy a call.

A recorded step replays fast, but what runs around it does not: on a GPU every copy or
fill into a step's buffers is a kernel launch, and every tensor made on the device from
a Python list a copy that waits for the device. Loading a decode step that way took ten
device operations besides the replay (``benchmarks/step_overhead.py`` counts them).
Here the inputs are views of one byte buffer on the device, each with a twin on the
host (pinned memory on a GPU, so that the copy does not wait): the step's loader writes
the twins with numpy, and ``send`` copies the whole buffer in one operation."""

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
        self._staged = torch.zeros(total, dtype=torch.uint8, pin_memory=pinned)
        staged_bytes = self._staged.numpy()
        self.device: dict[str, torch.Tensor] = {}
        self.host: dict[str, np.ndarray] = {}
        offset = 0
        for name, (shape, dtype) in layout:
            end = offset + math.prod(shape) * dtype.itemsize
            self.device[name] = self._sent[offset:end].view(dtype).view(shape)
            self.host[name] = staged_bytes[offset:end].view(_NUMPY[dtype]).reshape(shape)
            offset = end
        # marks the last send: the host twins are not written again before it has read them
        self._read = torch.cuda.Event() if pinned else None

    def writable(self) -> dict[str, np.ndarray]:
        """The host twins, once the last ``send`` has read them (at once on a CPU)."""
        if self._read is not None:
            self._read.synchronize()
        return self.host

    def send(self) -> None:
        """Every host twin into its device view: one copy, queued on the current stream
        (the step that reads them is queued after it)."""
        self._sent.copy_(self._staged, non_blocking=self._read is not None)
        if self._read is not None:
            self._read.record()


def host_array(values: torch.Tensor) -> np.ndarray | None:
    """``values`` as numpy when they are on the host (no copy), else None: values already
    on the device are copied there, never read back."""
    return values.numpy() if values.device.type == "cpu" else None
