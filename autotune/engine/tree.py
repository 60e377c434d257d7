"""Token trees for verification: shape, attention mask and positions.

A tree of N draft tokens hangs below the root, the last committed token, which is
verified with them. It is described by parents (parents come before children; -1 is the
root) or by paths of ranks in the Medusa / TensorRT-LLM ``choices`` format
(``[[0], [0, 0], [1], ...]``). Row 0 of every tensor here is the root; row i + 1 is node i.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch

ROOT = -1


@dataclass(frozen=True)
class TreeShape:
    parents: tuple[int, ...]

    def __post_init__(self):
        for node, parent in enumerate(self.parents):
            if not ROOT <= parent < node:
                raise ValueError(f"node {node} has parent {parent}: parents must come first")

    @classmethod
    def chain(cls, length: int) -> TreeShape:
        return cls(tuple(range(-1, length - 1)))

    @classmethod
    def from_choices(cls, choices) -> TreeShape:
        """``choices`` in canonical order (see ``canonical_order``)."""
        index = {tuple(path): i for i, path in enumerate(choices)}
        parents = []
        for path in choices:
            path = tuple(path)
            if len(path) > 1 and path[:-1] not in index:
                raise ValueError(
                    f"path {list(path)} needs its prefix {list(path[:-1])}, "
                    "which is not in the tree"
                )
            parents.append(index[path[:-1]] if len(path) > 1 else ROOT)
        return cls(tuple(parents))

    @property
    def size(self) -> int:
        return len(self.parents)

    @cached_property
    def depths(self) -> tuple[int, ...]:
        depths: list[int] = []
        for parent in self.parents:
            depths.append(1 if parent == ROOT else depths[parent] + 1)
        return tuple(depths)

    @cached_property
    def children(self) -> tuple[tuple[int, ...], ...]:
        """children[0]: the root's; children[i + 1]: node i's, in node order."""
        out: list[list[int]] = [[] for _ in range(self.size + 1)]
        for node, parent in enumerate(self.parents):
            out[parent + 1].append(node)
        return tuple(tuple(c) for c in out)

    @cached_property
    def is_chain(self) -> bool:
        return self.parents == tuple(range(-1, self.size - 1))

    def attention_mask(self, device) -> torch.Tensor:
        """[N + 1, N + 1] bool: each token sees itself and its ancestors (and the root)."""
        return self._mask.to(device)

    def position_offsets(self, device) -> torch.Tensor:
        """[N + 1]: depth of each token below the root (the root is at offset 0)."""
        return self._offsets.to(device)

    @cached_property
    def _mask(self) -> torch.Tensor:
        # built in numpy: a row copy there costs a tenth of torch's, and a dynamic tree
        # (EAGLE-2's 59 nodes, an n-gram lookup tree) makes its mask at every draft
        mask = np.zeros((self.size + 1, self.size + 1), dtype=np.bool_)
        mask[:, 0] = True
        for node, parent in enumerate(self.parents):
            row = node + 1
            if parent != ROOT:
                mask[row] = mask[parent + 1]
            mask[row, row] = True
        return torch.from_numpy(mask)

    @cached_property
    def _offsets(self) -> torch.Tensor:
        return torch.tensor((0, *self.depths), dtype=torch.long)


def chain_tree(depth: int) -> list[tuple[int, ...]]:
    """The single-branch tree of each step's top-1 token: [(0,), (0, 0), ...]."""
    return [(0,) * d for d in range(1, depth + 1)]


def canonical_order(choices) -> list[tuple[int, ...]]:
    """By depth, then by ranks: parents come before children, as TreeShape needs."""
    return sorted((tuple(path) for path in choices), key=lambda path: (len(path), path))


def smaller_tree(choices, size: int) -> list[tuple[int, ...]]:
    """The ``size`` paths of ``choices`` a likelier draft keeps first, in canonical order:
    fewest runner-up ranks along the path (the top-1 chain first, then the first
    alternatives), shallower first among equals. A parent never sorts after its child,
    so the kept paths are a tree."""
    paths = sorted((tuple(p) for p in choices), key=lambda path: (sum(path), len(path), path))
    return canonical_order(paths[:size])


def check_tree(choices, num_heads: int | None = None) -> list[tuple[int, ...]]:
    """The tree in canonical order, or a ValueError that says what is wrong with it."""
    if len(choices) == 0:
        raise ValueError("the tree is empty: it needs at least one path, e.g. [[0]]")
    paths = [tuple(path) for path in choices]
    seen: set[tuple[int, ...]] = set()
    for path in paths:
        if len(path) == 0:
            raise ValueError("the tree has an empty path; the root is implicit, leave it out")
        if any(not isinstance(rank, int) or rank < 0 for rank in path):
            raise ValueError(
                f"path {list(path)} has a negative rank (or not an integer); "
                "ranks are 0-based top-k indices"
            )
        if path in seen:
            raise ValueError(f"path {list(path)} appears more than once")
        seen.add(path)
    for path in paths:
        for d in range(1, len(path)):
            if path[:d] not in seen:
                raise ValueError(
                    f"path {list(path)} needs its prefix {list(path[:d])}, which is not in the tree"
                )
    depth = max(len(path) for path in paths)
    if num_heads is not None and depth > num_heads:
        raise ValueError(f"tree depth {depth} needs {depth} heads; the heads provide {num_heads}")
    return canonical_order(paths)
