"""Before any long work: which methods run, with what search spaces and heads. Every
check that needs no model is made here, so that a wrong request fails in seconds."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.errors import AutotuneError
from autotune.methods import registry
from autotune.methods.base import Expansion, Method
from autotune.profiling.request import ProfileRequest
from autotune.progress import say

# find_heads's mark for a method whose heads the run trains itself
TRAIN = "to be trained"


@dataclass(frozen=True)
class Setup:
    """The methods asked for, with their search spaces and head folders: what the run
    starts from (the plan, ``autotune.plan``, decides what of it runs)."""

    methods: list[Method]
    expansions: list[Expansion]
    spaces: dict[str, Any]
    heads: dict[str, Path]
    skipped: dict[str, str]  # method -> why it does not run
    train: dict[str, str] = field(default_factory=dict)  # method -> head kind to train


def make_setup(request: ProfileRequest) -> Setup:
    """Which methods run, with what search spaces and heads."""
    asked = request.methods or tuple(registry.names())
    entries = [registry.get(name) for name in asked]
    for name in list(request.heads) + list(request.search_spaces):
        if registry.get(name).name not in asked:
            raise AutotuneError(
                f"settings were given for {name}, which --methods leaves out: "
                f"add {name} to --methods or drop them"
            )
    methods = [e for e in entries if isinstance(e, Method)]
    expansions = [e for e in entries if isinstance(e, Expansion)]
    if expansions and not any(m.chain for m in methods):
        chains = [n for n, e in registry.methods().items() if e.chain]
        raise AutotuneError(
            f"{expansions[0].name} widens a chain method's drafts: add one of "
            f"{', '.join(chains)} to --methods"
        )
    if request.engines:
        methods, unserved = servable(methods, request.engines, request.methods is not None)
    else:
        unserved = {}
    heads, skipped = find_heads(methods, request)
    train = {
        name: str(registry.method(name).heads) for name, why in skipped.items() if why == TRAIN
    }
    skipped = {name: why for name, why in skipped.items() if why != TRAIN}
    methods = [m for m in methods if m.name not in skipped]
    spaces = {e.name: e.space(request.search_spaces.get(e.name)) for e in methods + expansions}
    return Setup(methods, expansions, spaces, heads, {**unserved, **skipped}, train)


def servable(
    methods: list[Method], engines: tuple[str, ...], asked: bool
) -> tuple[list[Method], dict[str, str]]:
    """The methods one of ``engines`` can serve, and why each other one is left out (an
    error when the user asked for methods and none of them can be served)."""
    from autotune.export.engines import ENGINES

    kept, unserved = [], {}
    for method in methods:
        if any(engine in method.exporters for engine in engines):
            kept.append(method)
            continue
        why = "; ".join(
            f"{ENGINES[e]}: {method.cannot_export.get(e, f'it has no {method.name} support')}"
            for e in engines
        )
        unserved[method.name] = f"--engine {', '.join(engines)} cannot serve it ({why})"
    if not kept:
        raise AutotuneError(
            f"none of the methods {'asked for' if asked else 'autotune has'} can be served by "
            f"{', '.join(engines)}: " + "; ".join(f"{m}: {why}" for m, why in unserved.items())
        )
    return kept, unserved


def find_heads(
    methods: list[Method], request: ProfileRequest
) -> tuple[dict[str, Path], dict[str, str]]:
    """The head folder of each method that drafts with heads: the one given, else one
    found (``training.sources``); the methods whose heads are to be trained (marked in the
    returned reasons with ``TRAIN``) or that cannot run, with the reason (an error when
    they were asked for and cannot be trained)."""
    from autotune.models import resolve_model
    from autotune.models.registry import fingerprint
    from autotune.training.sources import find_heads as find

    heads, skipped = {}, {}
    needs = [m for m in methods if m.heads is not None]
    resolved = resolve_model(request.model, request.model_path) if needs else None
    for method in needs:
        given = request.heads.get(method.name)
        if given is not None:
            folder = Path(given).expanduser().resolve()
            method.check_heads(folder)
            heads[method.name] = folder
            continue
        assert resolved is not None and method.heads is not None
        found = find(method.heads, resolved.name, fingerprint(resolved), method.check_heads)
        if found is not None:
            say(f"{method.name}: {method.heads} heads from {found.source}: {found.folder}")
            heads[method.name] = found.folder
        elif request.train_heads:
            skipped[method.name] = TRAIN
        else:
            skipped[method.name] = _no_heads(method, request)
    return heads, skipped


def _no_heads(method: Method, request: ProfileRequest) -> str:
    """Why a method whose heads are neither given, found nor trained cannot run (an error
    when the user named it)."""
    why = (
        f"no {method.heads} heads given or found: pass --heads {method.name}=DIR, "
        f"or train them with `autotune heads train --kind {method.heads}`"
    )
    if request.methods is not None:
        raise AutotuneError(f"--methods {method.name}: {why}")
    return why
