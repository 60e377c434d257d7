"""Exports of a profile to serving engines' own configuration formats.

``export_profile`` picks the method, finds its exporter for the engine (methods list
their exporters: ``autotune.methods.<name>.export``), renders it and returns an
``Export`` whose ``warnings`` list what the engine cannot express (also written into the
exported text).
"""

from __future__ import annotations

import dataclasses

from autotune.errors import AutotuneError
from autotune.export.base import Deployment, Export, Exporter
from autotune.export.engines import ENGINES
from autotune.methods import registry
from autotune.profile.blocks import EngineVerdict
from autotune.profile.schema import ProfileBase


def check_engine(engine: str) -> str:
    name = engine.strip().lower()
    if name not in ENGINES:
        raise AutotuneError(f"unknown engine '{engine}'; choose one of: {', '.join(ENGINES)}")
    return name


def exporter_for(method: str, engine: str) -> Exporter | None:
    return registry.method(method).exporters.get(engine)


def export_profile(
    profile: ProfileBase, engine: str, method: str | None = None, force: bool = False
) -> Export:
    """Render ``method`` (default: the profile's recommended one) for ``engine``. Without
    ``force`` only the recommended method is exported, and only if it measured faster
    than plain greedy decoding: the export is what gets deployed."""
    from autotune.profile.meaning import model_problem

    engine = check_engine(engine)
    problem = model_problem(profile)
    if problem is not None:
        raise AutotuneError(f"the profile's model block {problem}")
    name, choice_warnings = choose_method(profile, engine, method)
    if not force:
        guard_engine(profile, engine)
        guard(profile, name)
    missing = profile.missing(name)
    if missing:  # the export would point the engine at a folder that is not here
        raise AutotuneError(missing[0])
    problems = registry.method(name).problems(profile.block(name), profile.model)
    if problems:
        raise AutotuneError(
            f"the profile's {name} settings do not fit its model: " + "; ".join(problems)
        )
    exporter = exporter_for(name, engine)
    assert exporter is not None  # choose_method checked it
    deployment = Deployment.of(profile, name, engine)
    served = registry.method(name).for_engine(deployment.settings, engine)
    # measured in the engine itself, its own verdict decides (``guard_engine``)
    if served is not deployment.settings and not force and not in_engine_verdict(profile, engine):
        guard_variant(served, name, engine)
    rendered = exporter.render(dataclasses.replace(deployment, settings=served))
    # a switch of method is said on stderr; the file itself says which method it holds
    warnings = tuple(choice_warnings + rendered.warnings)
    return Export(
        engine=engine,
        method=name,
        engine_version=exporter.engine_version,
        text=rendered.text,
        filename=exporter.filename,
        warnings=warnings,
        about=rendered.about,
        companion=rendered.companion,
    )


def guard(profile: ProfileBase, name: str) -> None:
    """Refuse to export what the profile does not recommend, or what it measured no
    faster than plain greedy decoding (``--force`` passes)."""
    reason = f" ({profile.verdict.reason})" if profile.verdict is not None else ""
    if profile.recommended == "none":
        raise AutotuneError(
            f"the profile recommends no method{reason}; to export {name} anyway, pass --force"
        )
    if name != profile.recommended:
        raise AutotuneError(
            f"the profile recommends {profile.recommended}, not {name}{reason}; "
            f"to export {name} anyway, pass --force"
        )
    measured = profile.block(name).measured
    if measured is None:
        raise AutotuneError(
            f"{name} was never measured: run `autotune profile` again, or pass --force"
        )
    low = measured.speedup_interval[0] if measured.speedup_interval else measured.speedup
    if low <= 1.0:
        raise AutotuneError(
            f"{name} was not clearly faster than plain greedy decoding "
            f"({measured.speedup:.3f}x, interval low end {low:.3f}); to export "
            "it anyway, pass --force"
        )


def in_engine_verdict(profile: ProfileBase, engine: str) -> EngineVerdict | None:
    """The profile's verdict for ``engine`` from figures measured in it, where it has one."""
    return profile.verdict.engines.get(engine) if profile.verdict is not None else None


def guard_engine(profile: ProfileBase, engine: str) -> None:
    """Refuse an export to an engine whose own verdict, measured in it, recommends no
    method (``--force`` passes)."""
    verdict = in_engine_verdict(profile, engine)
    if verdict is not None and verdict.recommended == "none":
        raise AutotuneError(
            f"measured in {verdict.measured_in}, the profile recommends no method for "
            f"{ENGINES[engine]} ({verdict.reason}); serve it there without speculation, or "
            "to export anyway, pass --force"
        )


def guard_variant(settings, name: str, engine: str) -> None:
    """Refuse the engine's own setting where it measured no faster than plain greedy
    decoding in its drafting rule (``--force`` passes)."""
    figures = settings.measured or settings.selection
    if figures is None:
        return  # never decoded: the file says so (provenance)
    low = figures.speedup_interval[0] if figures.speedup_interval else figures.speedup
    if low <= 1.0:
        where = "held-back" if settings.measured is not None else "search"
        raise AutotuneError(
            f"{name} as {ENGINES[engine]} drafts it measured {figures.speedup:.3f}x on "
            f"{figures.prompts} {where} prompts (interval low end {low:.3f}): not clearly "
            f"faster than plain greedy decoding there; to export it anyway, pass --force"
        )


def choose_method(profile: ProfileBase, engine: str, method: str | None) -> tuple[str, list[str]]:
    """The method to export and, when it is not the one the profile recommends, why.

    Without ``method``: the profile's recommended method, else the first method present;
    if the engine cannot serve that one, the first present method it can (said in a
    warning, so the switch is never silent)."""
    present = list(profile.method_blocks())
    if not present:
        raise AutotuneError("the profile has no tuned method to export; run `autotune profile`")
    if method is not None:
        name = registry.get(method).name
        if name not in present:
            raise AutotuneError(f"the profile has no {name} settings; it has: {', '.join(present)}")
        _check_engine_serves(engine, name, present)
        return name, []
    default = profile.recommended if profile.recommended in present else present[0]
    if exporter_for(default, engine) is not None:
        return default, []
    servable = [name for name in present if exporter_for(name, engine) is not None]
    if not servable:
        _check_engine_serves(engine, default, present)
    chosen = servable[0]
    return chosen, [
        f"{ENGINES[engine]} cannot serve the profile's default method {default} "
        f"({_why_not(default, engine)}); exporting {chosen} instead"
    ]


def _why_not(method: str, engine: str) -> str:
    return registry.method(method).cannot_export.get(engine, f"it has no {method} support")


def _check_engine_serves(engine: str, name: str, present: list[str]) -> None:
    if exporter_for(name, engine) is not None:
        return
    serves = [m for m, entry in registry.methods().items() if engine in entry.exporters]
    others = [m for m in present if m in serves]
    hint = (
        f"; the profile's {', '.join(others)} can be exported to it (--method {others[0]})"
        if others
        else ""
    )
    raise AutotuneError(
        f"{ENGINES[engine]} cannot serve {name}: {_why_not(name, engine)}. "
        f"{engine} takes: {', '.join(serves) or 'none of the methods'}{hint}"
    )


__all__ = ["ENGINES", "Export", "Exporter", "check_engine", "export_profile"]
