"""Token trees as the serving engines spell them, and back.

A tree is a list of paths of ranks from the root, the Medusa / TensorRT-LLM ``choices``
format (``[[0], [0, 0], [1]]``; see ``autotune.engine.tree``). TensorRT-LLM's engine flow
takes it as a string on its command line (``--medusa_choices="[[0], [0, 0], [1]]"``),
written in canonical order (by depth, then ranks), the order the engine sorts into
itself, so a tree written and parsed back compares equal.
"""

from __future__ import annotations

import ast

from autotune.engine.tree import chain_tree, check_tree

Tree = list[tuple[int, ...]]


def format_choices(tree) -> str:
    """``[[0], [0, 0], [1]]``: TensorRT-LLM's ``medusa_choices`` / ``eagle_choices``."""
    return (
        "["
        + ", ".join("[" + ", ".join(str(r) for r in path) + "]" for path in check_tree(tree))
        + "]"
    )


def parse_choices(text: str) -> Tree:
    """A tree from either spelling (lists or tuples), checked, in canonical order."""
    try:
        value = ast.literal_eval(text.strip())
    except (ValueError, SyntaxError) as exc:
        raise ValueError(f"not a tree of rank paths: {text!r} ({exc})") from None
    if not isinstance(value, (list, tuple)) or not all(isinstance(p, (list, tuple)) for p in value):
        raise ValueError(f"not a tree of rank paths: {text!r}; expected e.g. [[0], [0, 0]]")
    return check_tree(value)


def tree_depth(tree) -> int:
    return max(len(path) for path in tree)


def max_branching(tree) -> int:
    """The most children any node has (the root included): the top-k a drafter needs."""
    children: dict[tuple[int, ...], int] = {}
    for path in tree:
        parent = tuple(path[:-1])
        children[parent] = children.get(parent, 0) + 1
    return max(children.values())


def is_chain(tree) -> bool:
    """[[0], [0, 0], ...]: one top-1 token per depth."""
    return [tuple(p) for p in check_tree(tree)] == chain_tree(len(tree))
