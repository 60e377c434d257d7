"""What the drafting heads' fixed-shape steps share (the EAGLE head's,
``heads.static_head``; GLIDE's draft's, ``heads.static_glide``) beyond what every step
keeps (``engine.recorded``: storage, buffers, runs recorded at their first call): their
buffers' inputs and per-row masks over a lane, and a run over the calls placed in it,
one step per shape and draft projection."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from autotune.engine import buckets
from autotune.engine.recorded import RecordedSteps
from autotune.engine.runner import visibility


class HeadBuffers:
    """One shape's buffers of a head's step, made once: ``lanes`` x ``size`` rows, lane by
    lane. ``columns``: the column each row writes in its lane of the head's storage;
    ``seen`` [lanes, size, columns]: the columns of its lane each row sees (True = may
    attend), loaded from the call's mask, which may span the cached prefix; ``logits``:
    per draft projection (its weight's module), ``logit_rows`` rows of draft logits.
    A subclass adds the head's own inputs and outputs."""

    def __init__(self, lanes: int, size: int, columns: int, like: torch.Tensor, logit_rows: int):
        device = like.device
        self.lanes, self.size, self.logit_rows = lanes, size, logit_rows
        self.positions = torch.zeros(lanes, size, dtype=torch.long, device=device)
        self.columns = torch.zeros(lanes, size, dtype=torch.long, device=device)
        self.seen = torch.zeros(lanes, size, columns, dtype=torch.bool, device=device)
        self.rows = torch.arange(size, device=device)
        self.logits: dict[nn.Linear, torch.Tensor] = {}

    def tensors(self) -> list[torch.Tensor]:
        own = [v for v in vars(self).values() if isinstance(v, torch.Tensor)]
        return own + list(self.logits.values())

    def drop(self, linear: nn.Linear) -> None:
        self.logits.pop(linear, None)

    def logits_for(self, linear: nn.Linear) -> torch.Tensor:
        if linear not in self.logits:
            weight = linear.weight
            self.logits[linear] = weight.new_zeros(self.logit_rows, weight.shape[0])
        return self.logits[linear]

    def load_idle(self, scratch: int) -> None:
        """Every row padding: it writes its lane's scratch column and sees only that one
        (the warm-up and capture runs, while sequences' entries sit in the storage)."""
        self.columns.fill_(scratch)
        self.seen.fill_(False)
        self.seen[:, :, scratch] = True

    def load_rows(self, lane: int, positions: torch.Tensor, prefix: int, mask) -> None:
        """A call's rows in ``lane``: at ``positions``, writing at ``prefix`` onward and
        seeing what ``mask`` allows (as ``Runner.forward`` takes it). On the device, no
        sync."""
        n = positions.shape[0]
        self.positions[lane, :n].copy_(positions)
        torch.add(self.rows[:n], prefix, out=self.columns[lane, :n])
        seen = self.seen[lane, :n]
        seen.fill_(False)
        visible = visibility(mask, prefix, n, seen.device)  # None: one row, sees everything
        seen[:, : prefix + n] = True if visible is None else visible


class HeadStep(RecordedSteps):
    """A head's steps and storage (``engine.recorded``), its variants the draft
    projections (a study tries several draft vocabularies)."""

    title = "a drafting head"

    def replay(self, placed: list[Any], linear: nn.Linear) -> Any:
        """Run the step over calls that fit it (each with its ``rows`` and ``lane``): the
        shape that holds them, its buffers loaded. Returns the buffers, or None where
        the recording was refused (the head runs eagerly)."""
        size = buckets.bucket_for(max(call.rows.positions.shape[0] for call in placed))
        assert size is not None  # placing checked each count against the largest bucket
        lanes = buckets.lanes_for(max(call.lane for call in placed))
        run = self.run_for(lanes, size, linear)
        if run is None:
            return None
        buffer = self.buffers[lanes, size]
        buffer.load(placed, self.scratch)
        run()
        self.ran(size, len(placed))
        return buffer
