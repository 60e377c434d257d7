"""What the drafting heads' fixed-shape steps share (the EAGLE head's,
``heads.static_head``; GLIDE's draft's, ``heads.static_glide``) beyond what every step
keeps (``engine.recorded``: storage, buffers, runs recorded at their first call): their
buffers' inputs and per-row masks over a lane, and a run over the calls placed in it,
one step per shape and draft projection."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import numpy as np
import torch
from torch import nn

from autotune.engine import buckets
from autotune.engine.recorded import RecordedSteps
from autotune.engine.runner import visibility
from autotune.engine.staging import HostInputs


class HeadBuffers:
    """One shape's buffers of a head's step, made once: ``lanes`` x ``size`` rows, lane by
    lane. ``columns``: the column each row writes in its lane of the head's storage;
    ``seen`` [lanes, size, columns]: the columns of its lane each row sees (True = may
    attend), loaded from the call's mask, which may span the cached prefix; ``logits``:
    per variant of the step (a draft projection, with what else the step varies by),
    ``logit_rows`` rows of draft logits.
    These inputs, and a subclass's (``fields``), are written on the host and sent in one
    copy (``engine.staging``); a subclass adds the head's other inputs and outputs."""

    def __init__(
        self,
        lanes: int,
        size: int,
        columns: int,
        like: torch.Tensor,
        logit_rows: int,
        fields: dict[str, tuple[tuple[int, ...], torch.dtype]] | None = None,
    ):
        self.lanes, self.size, self.logit_rows = lanes, size, logit_rows
        self.causal = np.tri(size, dtype=np.bool_)  # what each of a call's rows sees of theirs
        rows = (lanes, size)
        self.inputs = HostInputs(
            {
                "positions": (rows, torch.long),
                "columns": (rows, torch.long),
                "seen": ((lanes, size, columns), torch.bool),
                **(fields or {}),
            },
            like.device,
        )
        views = self.inputs.device
        self.positions, self.columns, self.seen = (
            views["positions"],
            views["columns"],
            views["seen"],
        )
        self.logits: dict[Hashable, torch.Tensor] = {}  # variant -> its draft logits

    def tensors(self) -> list[torch.Tensor]:
        own = [v for v in vars(self).values() if isinstance(v, torch.Tensor)]
        return own + list(self.logits.values())

    def drop(self, variant: Hashable) -> None:
        self.logits.pop(variant, None)

    def logits_for(self, variant: Hashable, linear: nn.Linear) -> torch.Tensor:
        """The draft logits ``variant``'s runs write, by ``linear``'s product: a buffer
        per variant, as each variant's runs are dropped on their own."""
        if variant not in self.logits:
            weight = linear.weight
            self.logits[variant] = weight.new_zeros(self.logit_rows, weight.shape[0])
        return self.logits[variant]

    def load_idle(self, scratch: int) -> None:
        """Every row padding (the warm-up and capture runs, while sequences' entries sit
        in the storage), sent."""
        self.idle(scratch)
        self.inputs.send()

    def idle(self, scratch: int) -> dict[str, np.ndarray]:
        """The host inputs set to every row padding, not yet sent: each row writes its
        lane's scratch column and sees only that one."""
        host = self.inputs.writable()
        host["columns"].fill(scratch)
        host["seen"].fill(False)
        host["seen"][:, :, scratch] = True
        return host

    def load_rows(self, lane: int, positions: torch.Tensor, prefix: int, mask) -> None:
        """A call's rows in ``lane``, on the host until ``inputs.send``: at ``positions``,
        writing at ``prefix`` onward and seeing what ``mask`` allows (as
        ``Runner.forward`` takes it). Nothing is read back from the device."""
        n = positions.shape[0]
        self.inputs.put("positions", (lane, slice(n)), positions)
        self.inputs.host["columns"][lane, :n] = np.arange(prefix, prefix + n)
        seen = self.inputs.host["seen"][lane, :n]
        seen.fill(False)
        if mask is None:  # causal (a commit's pairs): the prefix, and each row its earlier
            seen[:, :prefix] = True
            seen[:, prefix : prefix + n] = self.causal[:n, :n]
        else:
            visible = visibility(mask, prefix, n, mask.device)
            assert visible is not None  # None only where no mask was given
            self.inputs.put("seen", (lane, slice(n), slice(prefix + n)), visible)


class HeadStep(RecordedSteps):
    """A head's steps and storage (``engine.recorded``), its variants the draft
    projections (a study tries several draft vocabularies) and what else a head's step
    varies by."""

    title = "a drafting head"

    def replay(self, placed: list[Any], variant: Hashable) -> Any:
        """Run the step over calls that fit it (each with its ``rows`` and ``lane``): the
        shape that holds them, its buffers loaded. Returns the buffers, or None where
        the recording was refused (the head runs eagerly)."""
        size = buckets.bucket_for(max(call.rows.positions.shape[0] for call in placed))
        assert size is not None  # placing checked each count against the largest bucket
        lanes = buckets.lanes_for(max(call.lane for call in placed))
        run = self.run_for(lanes, size, variant)
        if run is None:
            return None
        buffer = self.buffers[lanes, size]
        buffer.load(placed, self.scratch)
        run()
        self.ran(size, len(placed))
        return buffer
