"""The selection: every method's final candidates (a chain method with and without each
fitted expansion) race side by side on search prompts, and the clearly slower drop out
round by round (``measure.race``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from autotune.budget import Budget
from autotune.measure.timing import EncodedPrompt, Measurement, Variant, interval_text
from autotune.methods import registry
from autotune.methods.base import DraftEnv
from autotune.profile.blocks import Figures, MethodSettings
from autotune.profiling.request import Measuring
from autotune.progress import say, step
from autotune.workspace import Workspace


@dataclass(frozen=True)
class Selection:
    """What the race on search prompts decided: the methods ranked (fastest first), their
    settings with the race's figures, and the methods it dropped, with why."""

    ranking: list[str]
    tuned: dict[str, MethodSettings]
    dropped: dict[str, str] = field(default_factory=dict)
    stopped: str = ""


def select(
    ws: Workspace, tuned: dict[str, MethodSettings], measuring: Measuring, budget: Budget
) -> Selection:
    """The candidates race within ``budget``; the methods ranked by the candidate each
    keeps, with the race's figures. A lone candidate is not raced: the held-back
    measurement judges it."""
    from autotune.measure.race import race
    from autotune.measure.timing import SideBySide

    env = DraftEnv(ws.ref, ws.runner)
    variants = {
        name: candidate
        for method_name, settings in tuned.items()
        for name, candidate in candidates(method_name, settings, env).items()
    }
    if len(variants) == 1:
        return Selection(list(tuned), dict(tuned))
    prompts = spread(ws.encode(ws.search_prompts()), measuring.select_prompts)
    session = SideBySide(ws.runner, variants, measuring.max_new_tokens)
    with step(
        "selection: the candidates race side by side (search prompts)",
        len(prompts) * len(variants),
    ) as advance:
        result = race(
            session, prompts, 1.0 + measuring.margin, budget, on_prompt=lambda _: advance()
        )
    if not any(m.prompts for m in result.measurements.values()):
        say("no time was left for the race: every method goes on to the held-back measurement")
        return Selection(list(tuned), dict(tuned), stopped=result.stopped)
    return _ranked(tuned, result)


def _ranked(tuned: dict[str, MethodSettings], result) -> Selection:
    """The race's result read per method: the candidate kept, its figures, and why a
    method none of whose candidates is left was dropped."""
    figures, kept, dropped = {}, {}, {}
    for name, settings in tuned.items():
        kept[name], figures[name] = keep_faster(settings, name, result.measurements, result.alive)
        names = candidates_of(name, settings)
        if not any(c in result.alive for c in names):
            # a method raced with an expansion too: say which figure is which
            dropped[name] = "; ".join(
                result.dropped[c] if len(names) == 1 else f"{c}: {result.dropped[c]}" for c in names
            )
    ranking = sorted(kept, key=lambda n: (n in dropped, -figures[n].speedup))
    say(
        "on search prompts: "
        + ", ".join(f"{n} {interval_text(figures[n].model_dump())}" for n in ranking)
        + f" (race {result.stopped} after {result.looks} looks)"
    )
    for name, why in dropped.items():
        say(f"{name} dropped from the race: {why}")
    return Selection(ranking, kept, dropped, result.stopped)


def candidates_of(name: str, settings: MethodSettings) -> list[str]:
    """The names ``candidates`` gives a method's variants: the method's own, then one per
    expansion fitted on it."""
    return [name] + [
        e.variant_name(name)
        for e in registry.expansions().values()
        if e.block(settings) is not None
    ]


def candidates(name: str, settings: MethodSettings, env: DraftEnv) -> dict[str, Variant]:
    """The variants a method races: without any expansion, then with each fitted one."""
    method = registry.method(name)
    fitted = [e for e in registry.expansions().values() if e.block(settings) is not None]
    without = settings
    for expansion in fitted:
        without = expansion.switched(without, enabled=False)
    out = {name: method.variant(without, env)}
    for expansion in fitted:
        with_it = expansion.switched(without, enabled=True)
        out[expansion.variant_name(name)] = method.variant(with_it, env)
    return out


def keep_faster(
    settings: MethodSettings,
    name: str,
    measured: dict[str, Measurement],
    alive: list[str] | None = None,
) -> tuple[MethodSettings, Figures]:
    """The settings with the faster of their candidates (of those still ``alive`` in a
    race, where one is), and its selection figures; each expansion fitted records its
    figures with and without it."""
    names = candidates_of(name, settings)
    left = [c for c in names if alive is None or c in alive] or names
    chosen = max(left, key=lambda c: measured[c].speedup) if len(names) > 1 else name
    for expansion in registry.expansions().values():
        label = expansion.variant_name(name)
        if label in names:
            figures = {
                "without": measured[name].summary(False)["speedup"],
                "with": measured[label].summary(False)["speedup"],
            }
            settings = expansion.switched(
                settings, enabled=chosen == label, selection_on_search_prompts=figures
            )
    figures_kept = Figures(**measured[chosen].summary(with_categories=False))
    return settings.model_copy(update={"selection": figures_kept}), figures_kept


def spread(prompts: list[EncodedPrompt], count: int) -> list[EncodedPrompt]:
    """``count`` prompts taken evenly through the list (files group prompts by category)."""
    if count >= len(prompts):
        return list(prompts)
    return [prompts[i * len(prompts) // count] for i in range(count)]


def finalists(tuned: dict[str, MethodSettings], ranking: list[str], bound: float) -> list[str]:
    """The methods still in the running after the selection: those whose search-prompt
    interval reaches above ``bound`` (best first); every method, when none has search
    figures (a lone method is not raced; a race may have had no time)."""
    if all(tuned[name].selection is None for name in ranking):
        return list(ranking)  # undecided, all of them
    out = []
    for name in ranking:
        selection = tuned[name].selection
        if selection is None:
            continue
        high = (selection.speedup_interval or [selection.speedup] * 2)[1]
        if high > bound:  # not clearly below the bar: still undecided
            out.append(name)
    return out
