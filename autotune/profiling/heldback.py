"""The held-back measurement: the finalists against plain greedy decoding, interleaved,
on prompts no choice was made on; then, after the verdict, the recommended method as
each serving engine's own rule serves it, on the same prompts."""

from __future__ import annotations

from dataclasses import dataclass, field

from autotune import plan
from autotune.budget import Budget
from autotune.measure.noise import Reading, probe
from autotune.measure.timing import EncodedPrompt, Measurement, Variant
from autotune.methods import registry
from autotune.methods.base import DraftEnv
from autotune.profile.blocks import EngineVariant, MethodSettings
from autotune.profiling.request import Measuring
from autotune.profiling.select import Selection, finalists
from autotune.progress import say, step
from autotune.workspace import Workspace

# An engine's own setting measured held back is named ``method@engine[,engine]``.
ENGINE_MARK = "@"


@dataclass(frozen=True)
class HeldBack:
    """The final measurement and what it decided."""

    measured: dict[str, Measurement]
    looks: int
    stopped: str
    planned: int = 0  # the held-back prompts it could have measured
    readings: list[Reading] = field(default_factory=list)  # the machine, between batches


def heldback(ws: Workspace, measuring: Measuring) -> list[EncodedPrompt]:
    """The held-back prompts the run measures on (``--heldback-prompts`` of them)."""
    return ws.encode(ws.heldback_prompts()[: measuring.heldback_prompts])


def measure_held_back(
    ws: Workspace, selection: Selection, measuring: Measuring, budget: Budget
) -> HeldBack:
    """The finalists the race left (the leader alone where it decided) against one plain
    greedy decoding per prompt, until the interval of the method ranked first decides
    against the bound (or the prompts run out): the figures reported. With no finalist,
    the method ranked first is measured, for the report."""
    from autotune.measure.sequential import measure_until_decided
    from autotune.measure.timing import SideBySide

    tuned, ranking = selection.tuned, selection.ranking
    if not tuned:
        return HeldBack({}, 0, "no method")
    bound = 1.0 + measuring.margin
    contenders = [n for n in finalists(tuned, ranking, bound) if n not in selection.dropped]
    env = DraftEnv(ws.ref, ws.runner)
    variants = {
        name: registry.method(name).variant(tuned[name], env) for name in contenders or ranking[:1]
    }
    prompts = heldback(ws, measuring)
    session = SideBySide(ws.runner, variants, measuring.max_new_tokens)
    readings: list[Reading] = []
    with step(
        f"held-back measurement: {', '.join(variants)} against plain greedy",
        len(prompts) * len(variants),
    ) as advance:
        result = measure_until_decided(
            session,
            prompts,
            contenders[0] if contenders else None,
            bound,
            budget,
            between=lambda: readings.append(probe(ws.runner)),
            on_prompt=lambda _: advance(),
            deadline=ws.deadline,  # the run's: its least prompts too stop there
        )
    return HeldBack(result.measurements, result.looks, result.stopped, len(prompts), readings)


def served_as_tuned(settings: MethodSettings, variant: EngineVariant) -> bool:
    """Whether an engine's own setting is the method's setting itself (the chosen one)."""
    return variant.setting in settings.model_dump(exclude={"engines"}).values()


def engine_settings_to_measure(tuned: dict[str, MethodSettings], recommended: str) -> bool:
    """Whether the recommended method has engine settings of its own left to measure."""
    settings = tuned.get(recommended)
    return settings is not None and any(
        not served_as_tuned(settings, v) for v in settings.engines.values()
    )


def engine_variants(name: str, settings: MethodSettings, env: DraftEnv) -> dict[str, Variant]:
    """``name``'s setting as each engine with a variant of its own serves it, distinct
    ones once, named ``method@engine[,engine]``."""
    method = registry.method(name)
    by_setting: dict[str, list[str]] = {}
    for engine, variant in settings.engines.items():
        if not served_as_tuned(settings, variant):  # else: the method's own figures
            by_setting.setdefault(repr(sorted(variant.setting.items())), []).append(engine)
    return {
        f"{name}{ENGINE_MARK}{','.join(engines)}": method.variant(
            method.for_engine(settings, engines[0]), env
        )
        for engines in by_setting.values()
    }


def measure_engine_settings(
    ws: Workspace,
    tuned: dict[str, MethodSettings],
    recommended: str,
    held: HeldBack,
    measuring: Measuring,
    keep_s: float = 0.0,
) -> HeldBack:
    """After the verdict, in the time the run has left (less ``keep_s``, the time planned
    for the phase after it): the recommended method as each engine serves it, against
    plain greedy on the held-back prompts the verdict was measured on; reported per
    engine, not judged (the verdict's measurement stays its own, undiluted)."""
    from autotune.measure.timing import measure_variants

    left = ws.deadline.left() if ws.deadline is not None else None
    left = None if left is None else left - keep_s
    if left is not None and left < plan.ENGINE_SETTINGS_MIN_S:
        say("no time was left to measure the engines' own settings held back")
        return held
    # its own time: what the run has left, less a margin for writing the profile
    budget = Budget(None if left is None else left - plan.ENGINE_SETTINGS_MARGIN_S)
    variants = engine_variants(recommended, tuned[recommended], DraftEnv(ws.ref, ws.runner))
    measured_on = max((len(m.prompts) for m in held.measured.values()), default=0)
    prompts = heldback(ws, measuring)[: max(measured_on, 1)]
    label = f"held back: {recommended} as {', '.join(tuned[recommended].engines)} serve it"
    with step(label, len(prompts) * len(variants)) as advance:
        measured = measure_variants(
            ws.runner,
            variants,
            prompts,
            measuring.max_new_tokens,
            on_prompt=lambda _: advance(),
            until=budget,
            least=0,
        )
    return HeldBack({**held.measured, **measured}, held.looks, held.stopped, held.planned)
