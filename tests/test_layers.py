"""The package's layers, read from its source: every import (at module level or inside a
function, but not one made for type checking only) points down the ladder

    engine -> heads -> drafters -> measure -> training -> tuners -> studies
        -> profile blocks, export base, the method registry -> the methods
        -> profile and export dispatch -> the commands' pipelines -> cli

and no module imports itself back through others (no cycles, type-checking imports
counted)."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "autotune"

# Lowest first; a module may import from its own layer and the layers below it. A module
# belongs to the longest prefix listed.
LAYERS: list[tuple[str, ...]] = [
    (
        "autotune.errors",
        "autotune.budget",
        "autotune.process_cache",
        "autotune.progress",
        "autotune.hardware",
        "autotune.paths",
        "autotune.output",
        "autotune.schedule",
        "autotune.plan",
        "autotune.files",
        "autotune.cache_entry",
    ),
    ("autotune.engine",),
    ("autotune.heads",),
    ("autotune.drafters",),
    ("autotune.models", "autotune.prompts"),
    ("autotune.measure", "autotune.serving"),
    ("autotune.training",),
    ("autotune.tuners",),
    ("autotune.studies",),
    ("autotune.workspace",),
    (
        "autotune.methods.registry",
        "autotune.methods.base",
        "autotune.methods.spaces",
        "autotune.profile.blocks",
        "autotune.export.base",
        "autotune.export.engines",
        "autotune.methods.__init__",
    ),
    ("autotune.profile", "autotune.export"),
    ("autotune.methods",),
    (
        "autotune.profiling",
        "autotune.bench",
        "autotune.runs",
        "autotune.verify",
        "autotune.commands",
    ),
    ("autotune.cli", "autotune.__main__"),
]

# Arrows the issue tracker names explicitly, whatever the layers above allow.
FORBIDDEN = [
    ("autotune.engine", "autotune.drafters"),
    ("autotune.export", "autotune.tuners"),
    ("autotune.profile", "autotune.tuners"),
    ("autotune.tuners", "autotune.studies"),
    ("autotune.tuners", "autotune.methods"),
]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(path: Path, *, type_checking: bool = False) -> set[str]:
    """Every autotune module ``path`` imports (``from a import b`` counts a.b when that is
    a module); type-checking-only imports left out unless ``type_checking``."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking_only(node) and not type_checking:
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("autotune"))
        elif (
            isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("autotune")
        ):
            # ``from package import module`` imports the module (the package's __init__
            # only runs on the way); ``from module import name`` imports the module
            submodules = [
                f"{node.module}.{a.name}" for a in node.names if _exists(f"{node.module}.{a.name}")
            ]
            found.update(submodules or [node.module])
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _exists(module: str) -> bool:
    base = PACKAGE.parent.joinpath(*module.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


@functools.cache
def graph(type_checking: bool = False) -> dict[str, set[str]]:
    """Module -> the autotune modules it imports (``type_checking``: those imported for
    type checking only too)."""
    return {
        module_name(p): imports_of(p, type_checking=type_checking) for p in PACKAGE.rglob("*.py")
    }


def layer_of(module: str) -> int:
    best, best_len = None, -1
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    if best is None:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS")
    return best


def test_every_module_has_a_layer():
    for module in graph():
        if module != "autotune":
            layer_of(module)


def test_no_import_points_up_the_ladder():
    upward = []
    for module, imported in graph().items():
        if module == "autotune":
            continue
        for target in imported:
            if target == "autotune" or target == module:
                continue
            if layer_of(target) > layer_of(module):
                upward.append(f"{module} imports {target}")
    assert not upward, "\n".join(sorted(upward))


@pytest.mark.parametrize("low,high", FORBIDDEN)
def test_named_arrows_are_absent(low, high):
    wrong = [
        f"{m} imports {t}"
        for m, ts in graph().items()
        if m.startswith(low)
        for t in ts
        if t.startswith(high)
    ]
    assert not wrong, "\n".join(wrong)


def test_no_import_cycles():
    # type-checking imports count: a cycle through them is still two modules that cannot
    # be read (or moved) apart
    imports = graph(type_checking=True)
    modules = set(imports)
    edges = {m: {t for t in ts if t in modules} for m, ts in imports.items()}
    cycles = []
    state: dict[str, int] = {}

    def walk(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(stack[stack.index(nxt) :] + [nxt]))
            elif nxt not in state:
                walk(nxt, stack + [nxt])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            walk(node, [node])
    # a package importing its own submodule in __init__ is not a cycle worth reporting
    cycles = [c for c in cycles if not _package_self_import(c)]
    assert not cycles, "\n".join(cycles)


def _package_self_import(cycle: str) -> bool:
    nodes = cycle.split(" -> ")
    return len(set(nodes)) == 2 and any(
        a.startswith(b + ".") or b.startswith(a + ".") for a in nodes for b in nodes if a != b
    )
