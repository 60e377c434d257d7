"""After the verdict, in the time the run has left: the recommended method with several
requests in flight (``tuners.load_schedule``), level by level, each level's setting
chosen on search rounds and measured on held-back ones."""

from __future__ import annotations

from autotune import plan
from autotune.measure.load import TUNED, LevelResult
from autotune.measure.timing import EncodedPrompt, categories_in_turn
from autotune.methods import registry
from autotune.methods.base import DraftEnv
from autotune.profile.blocks import Load, LoadLevel, MethodSettings
from autotune.profiling.heldback import HeldBack, heldback
from autotune.profiling.request import Measuring
from autotune.progress import say
from autotune.workspace import Workspace

# one request at a time: the verdict proved the setting there, so it is not raced again
PROVEN_LEVELS = frozenset({1})


def measure_load(
    ws: Workspace,
    tuned: dict[str, MethodSettings],
    recommended: str,
    held: HeldBack,
    measuring: Measuring,
) -> dict[str, MethodSettings]:
    """The tuned settings, the recommended method's with its schedule under load."""
    from autotune.tuners.load_schedule import fit_schedule

    settings = tuned[recommended]
    method = registry.method(recommended)
    candidates = method.load_settings(settings)
    env = DraftEnv(ws.ref, ws.runner)
    tokens = min(plan.LOAD_TOKENS, measuring.max_new_tokens)

    def seconds_left() -> float | None:
        left = ws.deadline.left() if ws.deadline is not None else None
        return None if left is None else left - plan.ENGINE_SETTINGS_MARGIN_S

    fitted = fit_schedule(
        ws.runner,
        {label: method.variant(s, env).make for label, (_, s) in candidates.items()},
        {label: cap for label, (cap, _) in candidates.items()},
        in_turn(ws.encode(ws.search_prompts())),
        in_turn(heldback(ws, measuring)),
        tokens,
        list(measuring.concurrency),
        plan.LOAD_ROUNDS,
        seconds_left,
        _first_level_s(held.measured.get(recommended), len(candidates), tokens, measuring),
        on_level=lambda line: say(f"[dim]under load, {line}[/dim]"),
        proven=PROVEN_LEVELS,
    )
    if fitted.skipped:
        say(
            f"no time was left to measure concurrency {', '.join(map(str, fitted.skipped))}: "
            "give a longer --budget, or `autotune bench --concurrency` afterwards"
        )
    load = Load(
        levels=[load_level(level.held, level.pick, level.cap) for level in fitted.levels],
        crossover=fitted.crossover,
        skipped=fitted.skipped,
        max_new_tokens=tokens,
    )
    return {**tuned, recommended: settings.model_copy(update={"load": load})}


def _first_level_s(greedy, candidates: int, tokens: int, measuring: Measuring) -> float | None:
    """About how long the first level takes, from greedy's held-back speed (None: not
    known): its runs, each round two requests."""
    if greedy is None or greedy.baseline_tokens_per_s <= 0 or not measuring.concurrency:
        return None
    runs = plan.load_level_runs(candidates, min(measuring.concurrency) in PROVEN_LEVELS)
    return runs * plan.LOAD_ROUNDS * 2 * tokens / greedy.baseline_tokens_per_s


def load_level(held: LevelResult, pick: str, cap: int | None) -> LoadLevel:
    """One level's profile block: the pick's held-back figures (off: plain decoding's
    own, a speedup of exactly 1) beside the tuned setting's."""
    tuned = held.figures[TUNED].summary()
    figure = held.figures.get(pick)
    if figure is None:  # off: plain decoding's own figures
        chosen = {
            **tuned,
            "speedup": 1.0,
            "speedup_interval": None,
            "tokens_per_s": tuned["baseline_tokens_per_s"],
            "latency_s": tuned["baseline_latency_s"],
        }
    else:
        chosen = {**figure.summary(), "lossless": figure.lossless and tuned["lossless"]}
    return LoadLevel(
        concurrency=held.concurrency,
        setting=pick,
        max_draft_tokens=cap,
        tuned_speedup=tuned["speedup"],
        tuned_interval=tuned["speedup_interval"],
        rounds=held.rounds,
        **chosen,
    )


def in_turn(prompts: list[EncodedPrompt]) -> list[list[int]]:
    """Token ids with the categories in turn: each round of a level holds several."""
    return [p.ids for p in categories_in_turn(prompts, len(prompts))]


def load_summary(load: Load | None) -> str:
    """One line on a schedule under load: each level's setting and speedup."""
    if load is None or not load.levels:
        return "no level measured"
    parts = [f"{lv.concurrency}: {lv.setting} {lv.speedup:.2f}x" for lv in load.levels]
    crossing = f"; off from {load.crossover}" if load.crossover else ""
    return ", ".join(parts) + crossing
