"""An EAGLE draft tree's levels drafted by the head in one recorded step.

Once the commit call has run (the pairs the target confirmed, ``heads.static_head``), the
rest of a proposal is the same sequence of head calls every time, whose shapes the tree
fixes. A static tree (EAGLE-1): per level, the top tokens of its parents' draft logits
picked by the tree's ranks, then the head over the level's expanded nodes. A dynamic
tree (EAGLE-2): per depth, the head over the ``top_k`` frontier nodes, their top
children scored by cumulative log-probability, the best ``top_k`` the next frontier.
Only the committed count changes between proposals, and with it the columns each row
writes, the positions and the masks over the committed prefix. Call by call, each
costs a dozen operations around its replay (top-k, gathers, the embedding, masks,
copies into the step's buffers), each a launch on a GPU, the GPU idle while the host
issues them. Here the tree is one step: its rows' columns, positions and masks over
the committed prefix laid out on the host and sent in one copy, the root's features
and logits copied in, every level run inside the step (top-k, picks, gathers, and a
dynamic tree's masks over its ancestors), and the tree read back once.

The step runs in the EAGLE head's storage, lane by lane as that step does, with its
arithmetic per call (``head_rows``); what it keeps is ``heads.draft_steps``'.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import nn

from autotune.engine import buckets, layers, staging
from autotune.engine.kvcache import KVCache
from autotune.engine.staging import HostInputs, sent
from autotune.engine.tree import ROOT
from autotune.heads.draft_steps import DraftSteps, Placed
from autotune.heads.eagle import DraftProjection, EagleHead
from autotune.heads.static_head import EagleStep, HeadInputs, head_rows


@dataclass(frozen=True)
class Level:
    """One depth of a static tree as drafting takes it, its parents being the previous
    level's expanded nodes in order (the first level's: the root). ``picks``: per node,
    its place among its parents' top tokens laid end to end (parent row x ``width`` +
    rank); ``expanded``: the rows of the nodes with children, which the head runs next;
    ``their_parents``: those nodes' parent rows; ``before``: the draft rows of earlier
    levels in the head's cache; ``seen`` [e, before + e]: of those and the e new ones,
    the rows each expanded row attends to: its ancestors' and its own."""

    depth: int
    width: int
    picks: list[int]
    expanded: list[int]
    their_parents: list[int]
    before: int
    seen: torch.Tensor

    @staticmethod
    def plan(choices: tuple[tuple[int, ...], ...]) -> list[Level]:
        """The levels of a tree in canonical order (parents before children)."""
        has_children = {path[:-1] for path in choices}
        row: dict[tuple[int, ...], int] = {(): 0}  # an expanded node's row at its level
        column: dict[tuple[int, ...], int] = {}  # its draft row in the head's cache
        levels, before = [], 0
        for depth in range(1, max(len(path) for path in choices) + 1):
            nodes = [path for path in choices if len(path) == depth]
            width = 1 + max(path[-1] for path in nodes)
            expanded = [i for i, path in enumerate(nodes) if path in has_children]
            seen = torch.zeros(len(expanded), before + len(expanded), dtype=torch.bool)
            for i, at in enumerate(expanded):
                path = nodes[at]
                row[path], column[path] = i, before + i
                seen[i, [column[path[:d]] for d in range(1, depth + 1)]] = True
            picks = [row[path[:-1]] * width + path[-1] for path in nodes]
            their_parents = [row[nodes[at][:-1]] for at in expanded]
            levels.append(Level(depth, width, picks, expanded, their_parents, before, seen))
            before += len(expanded)
        return levels


class DynamicShape(NamedTuple):
    """What an EAGLE-2 tree's step runs: ``depth`` expansions of ``top_k`` frontier nodes
    below the first level's ``top_k`` (which nodes are kept is the drafter's, on the host)."""

    depth: int
    top_k: int


# a static tree's choices (``Level.plan``), or a dynamic tree's shape
Tree = tuple[tuple[int, ...], ...] | DynamicShape


class Grown(NamedTuple):
    """A dynamic tree as grown, on the host: per node (each expansion's children after the
    first level's), its token, parent node (ROOT for the first level), cumulative draft
    log-probability and depth, as arrays (EAGLE-2's 60/5/10 grows 510 nodes a draft)."""

    tokens: np.ndarray
    parents: np.ndarray
    scores: np.ndarray
    depths: np.ndarray


class TreeCall(NamedTuple):
    """One sequence's tree to draft: its head cache (the committed pairs in it), the
    position of its root (the last committed token), and the root's predicted
    features [1, H] and draft logits [1, V'] (the commit call's last row)."""

    cache: KVCache
    position: int
    features: torch.Tensor
    logits: torch.Tensor


def rows_to_take(rows: list[int], device: torch.device) -> torch.Tensor | slice:
    """``rows`` as an index on ``device``: a slice (a view) where they are the first rows
    in order, else an index tensor, sent without waiting for the device."""
    return slice(len(rows)) if rows == list(range(len(rows))) else sent(rows, device)


class TreeBuffers:
    """One tree's buffers over ``lanes`` lanes, made once: the host inputs (``fields``,
    ``engine.staging``) and the root's features and logits in; a subclass lays out its
    rows' inputs (``place``) and adds its outputs."""

    def __init__(self, lanes: int, head: EagleHead, width: int, fields: dict[str, Any]):
        weight = head.fc.weight
        self.lanes, self.device = lanes, weight.device
        self.inputs = HostInputs(fields, weight.device)
        self.root_features = weight.new_zeros(lanes, 1, head.hidden_size)
        self.root_logits = weight.new_zeros(lanes, 1, width)

    def tensors(self) -> list[torch.Tensor]:
        own = [v for v in vars(self).values() if isinstance(v, torch.Tensor)]
        return [*self.inputs.device.values(), *own]

    def idle(self, scratch: int) -> dict[str, np.ndarray]:
        """The host inputs with every row padding, not yet sent: each writes its lane's
        scratch column, at position 0, and sees only that column."""
        host = self.inputs.writable()
        for name, values in host.items():
            if name.startswith("columns"):
                values.fill(scratch)
            elif name.startswith("positions"):
                values.fill(0)
            else:  # a mask
                values.fill(False)
                values[..., scratch] = True
        return host

    def load_idle(self, scratch: int) -> None:
        self.idle(scratch)
        self.inputs.send()

    def load(self, calls: list[tuple[TreeCall, int, int]], scratch: int) -> None:
        """Each call (with its lane and committed pairs) in its lane, every other lane
        padding; its root copied in. No sync."""
        host = self.idle(scratch)
        for call, lane, prefix in calls:
            self.place(host, call.position, lane, prefix)
            self.root_features[lane].copy_(call.features)
            self.root_logits[lane].copy_(call.logits)
        self.inputs.send()

    def place(self, host: dict[str, np.ndarray], position: int, lane: int, prefix: int) -> None:
        raise NotImplementedError


class StaticBuffers(TreeBuffers):
    """A static tree's buffers: per level with expanded nodes, its rows' positions,
    columns and visible columns; out, the tree's tokens in canonical order."""

    def __init__(self, lanes: int, levels: list[Level], columns: int, head: EagleHead, width: int):
        self.levels = levels
        self.running = [level for level in levels if level.expanded]
        fields: dict[str, Any] = {}
        for i, level in enumerate(self.running):
            rows = (lanes, len(level.expanded))
            fields[f"positions{i}"] = (rows, torch.long)
            fields[f"columns{i}"] = (rows, torch.long)
            fields[f"seen{i}"] = ((*rows, columns), torch.bool)
        super().__init__(lanes, head, width, fields)
        nodes = sum(len(level.picks) for level in levels)
        self.tokens = torch.zeros(lanes, nodes, dtype=torch.long, device=self.device)
        self.indices = [
            tuple(
                rows_to_take(rows, self.device)
                for rows in (lv.picks, lv.expanded, lv.their_parents)
            )
            for lv in levels
        ]

    def tensors(self) -> list[torch.Tensor]:
        indices = [i for level in self.indices for i in level if isinstance(i, torch.Tensor)]
        return [*super().tensors(), *indices]

    def place(self, host: dict[str, np.ndarray], position: int, lane: int, prefix: int) -> None:
        """Each level's rows at the position below the root their depth gives, writing
        the columns after the committed pairs (``prefix``) and the earlier levels' rows,
        seeing the committed pairs, their ancestors' rows and their own."""
        for i, level in enumerate(self.running):
            count, first = len(level.expanded), prefix + level.before
            host[f"positions{i}"][lane] = position + level.depth - 1
            host[f"columns{i}"][lane] = np.arange(first, first + count)
            seen = host[f"seen{i}"][lane]
            seen.fill(False)
            seen[:, :prefix] = True
            seen[:, prefix : first + count] = level.seen.numpy()


class DynamicBuffers(TreeBuffers):
    """A dynamic tree's buffers: per depth, its ``top_k`` rows' positions and columns,
    and the committed pairs every row sees (its ancestors' rows are found in the step);
    out, every grown node's token and parent, and its score."""

    def __init__(self, lanes: int, shape: DynamicShape, columns: int, head: EagleHead, width: int):
        self.shape = shape
        rows = (lanes, shape.depth, shape.top_k)
        fields = {
            "positions": (rows, torch.long),
            "columns": (rows, torch.long),
            "committed": ((lanes, 1, columns), torch.bool),
        }
        super().__init__(lanes, head, width, fields)
        k = shape.top_k
        nodes = k + shape.depth * k * k
        self.ids = torch.zeros(lanes, 2 * nodes, dtype=torch.long, device=self.device)
        self.scores = torch.zeros(lanes, nodes, device=self.device)
        self.own = torch.eye(k, dtype=torch.bool, device=self.device).expand(lanes, k, k)
        self.first = torch.arange(k, device=self.device).expand(lanes, k)
        self.roots = torch.full((lanes, k), ROOT, dtype=torch.long, device=self.device)

    def place(self, host: dict[str, np.ndarray], position: int, lane: int, prefix: int) -> None:
        """Depth d's rows at the root's position + d - 1, writing the columns after the
        committed pairs (``prefix``) and the earlier depths' rows."""
        depth, k = self.shape
        host["positions"][lane] = np.arange(position, position + depth)[:, None]
        host["columns"][lane] = np.arange(prefix, prefix + depth * k).reshape(depth, k)
        host["committed"][lane].fill(False)
        host["committed"][lane, :, :prefix] = True

    def depths(self) -> np.ndarray:
        """Each grown node's depth, in the order of ``ids``' first half."""
        depth, k = self.shape
        return np.repeat(np.arange(1, depth + 2), [k] + [k * k] * depth)


class TreeSteps(DraftSteps[Tree]):
    """The trees' steps over an EAGLE head's storage (see the module's docstring),
    recorded as the head's step records (``engine.capture``)."""

    title = "the EAGLE head's tree"
    kept_as = "_autotune_trees"

    def __init__(self, step: EagleStep, embed: nn.Embedding):
        super().__init__(step.head.fc.weight.device, step.how, embed)
        self.head, self.storage = step.head, step.storage

    @property
    def scratch(self) -> int:
        return self.storage.columns - buckets.SCRATCH_COLUMNS

    def versions(self) -> int:
        return self.storage.version

    def draft(
        self, calls: list[TreeCall], tree: Tree, projection: DraftProjection
    ) -> list[list[int]] | list[Grown] | None:
        """Per call, its tree as drafted: a static tree's tokens in canonical order, or a
        dynamic tree's nodes as grown; each cache then holds the draft rows after its
        committed pairs. None where the calls do not fit (``fits``) or the step could
        not be recorded (the drafter runs the tree one call at a time)."""
        if isinstance(tree, DynamicShape):
            drafted = tree.depth * tree.top_k
        else:
            drafted = len({path[:-1] for path in tree if len(path) > 1})  # expanded nodes
        placed = self.fits(calls, drafted)
        buffer = None if placed is None else self.run(calls, placed, tree, projection)
        if placed is None or buffer is None:
            return None
        for cache, prefix in placed:
            cache.lengths = [prefix + drafted] * len(cache.lengths)
        lanes = [cache.lane for cache, _ in placed]
        if isinstance(buffer, StaticBuffers):
            tokens = buffer.tokens.tolist()  # the one read of the draft
            return [tokens[lane] for lane in lanes]
        ids = staging.read_back(buffer.ids)  # its two reads
        scores = staging.read_back(buffer.scores)
        nodes, depths = scores.shape[1], buffer.depths()
        return [Grown(ids[lane, :nodes], ids[lane, nodes:], scores[lane], depths) for lane in lanes]

    def fits(self, calls: list[TreeCall], drafted: int) -> Placed | None:
        """Each call's cache and its committed pairs, or None unless every cache is the
        live borrower of its own lane here, at one length in every layer, with room for
        the tree's ``drafted`` rows before the scratch column."""
        return self.placed([call.cache for call in calls], self.storage, drafted)

    def make(
        self, lanes: int, tree: Tree, projection: DraftProjection
    ) -> tuple[TreeBuffers, functools.partial, list[torch.Tensor], str]:
        width, columns = projection.linear.weight.shape[0], self.storage.columns
        linear, vocabulary = projection.linear, projection.ids
        buffer: TreeBuffers
        if isinstance(tree, DynamicShape):
            buffer = DynamicBuffers(lanes, tree, columns, self.head, width)
            step = functools.partial(self.compute_dynamic, buffer, linear, vocabulary)
            what = f"{tree.depth}-deep dynamic"
        else:
            buffer = StaticBuffers(lanes, Level.plan(tree), columns, self.head, width)
            step = functools.partial(self.compute_static, buffer, linear, vocabulary)
            what = f"{max(map(len, tree))}-level static"
        statics = [*self.storage.keys, *self.storage.values, *buffer.tensors()]
        return buffer, step, statics, what

    def compute_static(
        self, buffer: StaticBuffers, linear: nn.Linear, ids: torch.Tensor | None
    ) -> None:
        """A static tree's step: per level, its parents' top tokens (as token ids:
        ``DraftProjection.tokens``) picked by the tree's ranks, then the head over its
        expanded nodes (``head_rows``) and their draft logits; the tokens into
        ``buffer.tokens``. The eager drafter's arithmetic, with the lanes as a batch."""
        lanes, inputs, running = buffer.lanes, buffer.inputs.device, 0
        logits, features = buffer.root_logits, buffer.root_features  # [lanes, parents, .]
        found = []
        for level, (picks, expanded, their_parents) in zip(buffer.levels, buffer.indices):
            best = logits.topk(level.width, dim=-1).indices  # [lanes, parents, width]
            tokens = (best if ids is None else ids[best]).view(lanes, -1)[:, picks]
            found.append(tokens)
            if not level.expanded:
                continue
            rows = HeadInputs(
                features[:, their_parents],
                self.embed(tokens[:, expanded]),
                inputs[f"positions{running}"],
                inputs[f"seen{running}"],
            )
            features = head_rows(self.head, self.storage, rows, inputs[f"columns{running}"])
            logits = layers.linear(features, linear)  # as ``DraftProjection`` multiplies
            running += 1
        buffer.tokens.copy_(torch.cat(found, dim=1))

    def compute_dynamic(
        self, buffer: DynamicBuffers, linear: nn.Linear, ids: torch.Tensor | None
    ) -> None:
        """A dynamic tree's step: the root's top ``k`` tokens, then per depth the head over
        the frontier, each frontier node's top ``k`` children scored by cumulative draft
        log-probability, the best ``k`` of them the next frontier, each seeing the
        committed pairs, its ancestors' rows and its own (found here from the parents
        kept); every node's token, parent and score into the buffer. The eager drafter's
        arithmetic (``EagleDrafter._dynamic``), with the lanes as a batch."""
        (depth, k), lanes, inputs = buffer.shape, buffer.lanes, buffer.inputs.device
        columns = inputs["columns"].view(lanes, depth * k)
        hidden, span = buffer.root_features.shape[-1], inputs["committed"].shape[-1]
        scores, best = buffer.root_logits[:, 0].float().log_softmax(-1).topk(k, dim=-1)
        tokens = best if ids is None else ids[best]  # [lanes, k]
        frontier, features = buffer.first, buffer.root_features.expand(lanes, k, hidden)
        ancestors = buffer.own  # [lanes, k, rows so far]: the draft rows each row sees
        grown, parents, kept_scores = [tokens], [buffer.roots], [scores]
        first = 0  # the index of the last expansion's first node
        for d in range(1, depth + 1):
            written = columns[:, None, : d * k].expand(lanes, k, d * k)  # rows so far
            draft = torch.zeros(lanes, k, span, dtype=torch.bool, device=buffer.device)
            seen = inputs["committed"] | draft.scatter_(2, written, ancestors)
            rows = HeadInputs(features, self.embed(tokens), inputs["positions"][:, d - 1], seen)
            predicted = head_rows(self.head, self.storage, rows, inputs["columns"][:, d - 1])
            logp = layers.linear(predicted, linear).float().log_softmax(-1)
            child_logp, child_best = logp.topk(k, dim=-1)  # [lanes, k, k]
            tokens = (child_best if ids is None else ids[child_best]).view(lanes, k * k)
            scores = (scores[:, :, None] + child_logp).view(lanes, k * k)
            grown.append(tokens)
            parents.append(frontier[:, :, None].expand(lanes, k, k).reshape(lanes, k * k))
            kept_scores.append(scores)
            first += k if d == 1 else k * k
            if d == depth:
                break
            scores, kept = scores.topk(k, dim=-1)  # the next frontier
            tokens, frontier, rows_kept = tokens.gather(1, kept), first + kept, kept // k
            features = predicted.gather(1, rows_kept[:, :, None].expand(lanes, k, hidden))
            above = ancestors.gather(1, rows_kept[:, :, None].expand(lanes, k, d * k))
            ancestors = torch.cat([above, buffer.own], dim=2)
        buffer.ids.copy_(torch.cat(grown + parents, dim=1))
        buffer.scores.copy_(torch.cat(kept_scores, dim=1))
