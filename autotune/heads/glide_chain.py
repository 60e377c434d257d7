"""GLIDE's greedy chain drafted in one recorded step, where no exit can cut it short.

After the commit call (the tokens committed since the last proposal, ``heads.static_glide``),
a greedy chain whose exit threshold never fires is the same sequence of one-row draft
calls at every proposal: each step's most probable token, embedded, one position on,
reading the same target cache. Only the committed counts change between proposals, and
with them each row's position, column and masks. Call by call, each step costs a few
operations around its replay (the softmax and argmax, the embedding, copies into the
step's buffers), each a launch on a GPU. Here the chain is one step: its rows' columns,
positions and masks laid out on the host and sent in one copy, the first step's logits
copied in, every step run inside (its token picked there), and the chain's tokens read
back once; its distributions stay on the device for what the drafter keeps of them.

It runs in the GLIDE step's storages, lane by lane, with its arithmetic per row
(``draft_rows``); what it keeps is ``heads.draft_steps``'.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np
import torch
from torch import nn

from autotune.engine import layers
from autotune.engine.kvcache import KVCache
from autotune.engine.staging import HostInputs
from autotune.engine.static_cache import StaticCache
from autotune.heads.draft_steps import DraftSteps, Placed
from autotune.heads.eagle import DraftProjection
from autotune.heads.static_glide import DraftInputs, GlideStep, draft_rows


class ChainCall(NamedTuple):
    """One sequence's chain to draft: its draft cache (the committed tokens in it), its
    target cache, the target entries the draft reads (``committed``), the position of the
    root (the last committed token), and the first step's draft logits [V'] (the commit
    call's)."""

    cache: KVCache
    target: KVCache
    committed: int
    position: int
    logits: torch.Tensor


class ChainBuffers:
    """One chain's buffers over ``lanes`` lanes, made once: per later step (``length`` - 1
    of them) its row's position, column and visible columns, and each lane's committed
    target entries (host inputs, ``engine.staging``); the first step's logits in; the
    chain's tokens and every step's distribution over the draft vocabulary out."""

    def __init__(
        self, lanes: int, length: int, columns: tuple[int, int], width: int, like: torch.Tensor
    ):
        """``columns``: a lane's in the draft's storage and in the target's."""
        self.lanes, self.length = lanes, length
        rows = (lanes, length - 1)
        fields = {
            "positions": (rows, torch.long),
            "columns": (rows, torch.long),
            "seen": ((*rows, columns[0]), torch.bool),
            "cross_prefix": ((lanes,), torch.long),
        }
        self.inputs = HostInputs(fields, like.device)
        self.first = like.new_zeros(lanes, width)
        self.tokens = torch.zeros(lanes, length, dtype=torch.long, device=like.device)
        self.probs = torch.zeros(lanes, length, width, device=like.device)
        self.target_columns = torch.arange(columns[1], device=like.device)

    def tensors(self) -> list[torch.Tensor]:
        own = [v for v in vars(self).values() if isinstance(v, torch.Tensor)]
        return [*self.inputs.device.values(), *own]

    def idle(self, scratch: int) -> dict[str, np.ndarray]:
        """Every row padding, not yet sent: at position 0, writing its lane's scratch
        column and seeing only that one, reading the target's first column."""
        host = self.inputs.writable()
        host["positions"].fill(0)
        host["columns"].fill(scratch)
        host["seen"].fill(False)
        host["seen"][:, :, scratch] = True
        host["cross_prefix"].fill(1)
        return host

    def load_idle(self, scratch: int) -> None:
        self.idle(scratch)
        self.inputs.send()

    def load(self, calls: list[tuple[ChainCall, int, int]], scratch: int) -> None:
        """Each call (with its lane and draft cache length) in its lane: step s's row at the
        root's position + s, writing the column after the earlier steps' and seeing the
        columns up to its own, reading the committed target entries. No sync."""
        host, steps = self.idle(scratch), np.arange(self.length - 1)
        for call, lane, prefix in calls:
            host["positions"][lane] = call.position + 1 + steps
            host["columns"][lane] = prefix + steps
            seen = host["seen"][lane]
            seen.fill(False)
            seen[:, :prefix] = True
            seen[:, prefix : prefix + self.length - 1] = np.tri(self.length - 1, dtype=bool)
            host["cross_prefix"][lane] = call.committed
            self.first[lane].copy_(call.logits)
        self.inputs.send()


class ChainSteps(DraftSteps[int]):
    """The greedy chains' steps over a GLIDE step's storages (see the module's
    docstring), recorded as that step records (``engine.capture``)."""

    title = "the GLIDE draft's chain"
    kept_as = "_autotune_chains"

    def __init__(self, step: GlideStep, embed: nn.Embedding):
        super().__init__(step.storage.device, step.how, embed)
        self.step = step

    @property
    def scratch(self) -> int:
        return self.step.scratch

    def versions(self) -> tuple[int, int | None]:
        target = self.step.target
        return self.step.storage.version, None if target is None else target.storage.version

    def draft(
        self, calls: list[ChainCall], length: int, projection: DraftProjection
    ) -> list[tuple[list[int], torch.Tensor]] | None:
        """Per call, its chain's tokens and their distributions [length, V'] (a view, valid
        until the next chain of this shape), its draft cache holding the chain's rows
        after the committed tokens; None where the calls do not fit (``fits``) or the step
        could not be recorded (the drafter runs the chain a call a step)."""
        placed = self.fits(calls, length - 1)
        buffer = None if placed is None else self.run(calls, placed, length, projection)
        if placed is None or buffer is None:
            return None
        for cache, prefix in placed:
            cache.lengths = [prefix + length - 1] * len(cache.lengths)
        tokens = buffer.tokens.tolist()  # the one read of the chain
        return [(tokens[cache.lane], buffer.probs[cache.lane]) for cache, _ in placed]

    def fits(self, calls: list[ChainCall], rows: int) -> Placed | None:
        """Each call's draft cache and its length, or None unless every draft cache is the
        live borrower of its lane of the step's storage and its target cache of the same
        lane of the target's, at one length in every layer, with the committed target
        entries written and room for the chain's ``rows`` before the scratch column."""
        target = self.step.target
        placed = self.placed([call.cache for call in calls], self.step.storage, rows)
        if target is None or placed is None:
            return None
        for call, (cache, _) in zip(calls, placed):
            read = call.target
            if not isinstance(read, StaticCache) or not target.storage.holds(read):
                return None
            layers_read = [read.lengths[t] for t in self.step.draft.target_layers]
            if read.lane != cache.lane or not 1 <= call.committed <= min(layers_read):
                return None
        return placed

    def make(
        self, lanes: int, length: int, projection: DraftProjection
    ) -> tuple[ChainBuffers, functools.partial, list[torch.Tensor], str]:
        target = self.step.target
        assert target is not None  # fits() found it
        width = projection.linear.weight.shape[0]
        columns = (self.step.storage.columns, target.storage.columns)
        buffer = ChainBuffers(lanes, length, columns, width, self.step.draft.norm.weight)
        step = functools.partial(self.compute, buffer, projection.linear, projection.ids)
        statics = [*self.step.storage.keys, *self.step.storage.values, *buffer.tensors()]
        statics += [target.storage.keys[t] for t in self.step.draft.target_layers]
        statics += [target.storage.values[t] for t in self.step.draft.target_layers]
        return buffer, step, statics, f"{length}-token"

    def compute(self, buffer: ChainBuffers, linear: nn.Linear, ids: torch.Tensor | None) -> None:
        """The step itself: per step, the distribution of its draft logits and its most
        probable token (as a token id: ``DraftProjection.tokens``), then (but for the
        last) that token's row through the draft (``draft_rows``) and the projection.
        The eager drafter's arithmetic (``GlideDrafter._to_the_limit``), lanes as a batch."""
        target = self.step.target
        assert target is not None  # fits() found it
        lanes, inputs, draft = buffer.lanes, buffer.inputs.device, self.step.draft
        cross = buffer.target_columns.view(1, 1, -1) < inputs["cross_prefix"].view(lanes, 1, 1)
        logits, tokens, dists = buffer.first, [], []
        for s in range(buffer.length):
            probs = logits.float().softmax(-1)  # [lanes, V']
            index = probs.argmax(-1)
            tokens.append(index if ids is None else ids[index])
            dists.append(probs)
            if s == buffer.length - 1:
                break
            row = slice(s, s + 1)
            rows = DraftInputs(
                self.embed(tokens[-1])[:, None],
                inputs["positions"][:, row],
                inputs["seen"][:, row],
                cross,
            )
            columns = inputs["columns"][:, row]
            normed = draft_rows(draft, self.step.storage, target, rows, columns)
            logits = layers.linear(normed[:, 0], linear)  # as ``DraftProjection`` multiplies
        buffer.tokens.copy_(torch.stack(tokens, dim=1))
        buffer.probs.copy_(torch.stack(dists, dim=1))
