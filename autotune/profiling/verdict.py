"""The verdict's rules, in one place: the fastest finalist on the held-back prompts whose
simultaneous interval (over the finalists and the looks) clears 1 + margin and whose
output matched plain greedy decoding is recommended; otherwise none, with the reason.

Every reason is one of ``REASONS`` and quotes figures that agree with what it says: a
"none, nothing was faster" never quotes a speedup above the bar as the fastest, and a
method faster on the search prompts but not proven held back is said to be exactly that
(``tests/test_verdict_paths.py`` renders each path and checks its figures)."""

from __future__ import annotations

from dataclasses import dataclass

from autotune.measure.stats import MIN_PROMPTS, Interval
from autotune.measure.timing import Measurement
from autotune.profile.blocks import MethodSettings, Verdict
from autotune.profiling.heldback import HeldBack
from autotune.profiling.select import finalists

# Each way the verdict can end, and what it means.
REASONS = {
    "no method": "no method was tuned",
    "slower on search": "no method's search-prompt interval reached above the bar",
    "not measured held back": "a finalist, but no held-back prompt was measured",
    "budget cut": "too few held-back prompts measured before the deadline to prove anything",
    "recommended": "a finalist's held-back interval lies above the bar, output lossless",
    "lossy": "every finalist's output differed from plain greedy decoding",
    "not proven": "no lossless finalist's held-back interval lies above the bar",
}


@dataclass(frozen=True)
class Judgement:
    """What the verdict says: one of ``REASONS``, the method recommended, and why."""

    path: str
    recommended: str
    reason: str


def simultaneous_interval(measured: Measurement, among: int):
    """The speedup's interval allowing for its looks and for ``among`` finalists compared
    at once (Bonferroni): what a choice between them may be read off."""
    from autotune.measure.stats import CONFIDENCE, bootstrap_interval, look_confidence

    return bootstrap_interval(
        measured.pairs(), look_confidence(CONFIDENCE, max(1, measured.looks) * max(1, among))
    )


def decide(
    tuned: dict[str, MethodSettings],
    ranking: list[str],
    held: HeldBack,
    margin: float,
    skipped: dict[str, str] | None = None,
) -> Verdict:
    """The verdict on the held-back figures. ``skipped``: the methods not run, with why;
    the verdict keeps them."""
    judgement = judge(tuned, ranking, held, margin)
    return Verdict(
        recommended=judgement.recommended,
        reason=judgement.reason,
        margin=margin,
        ranking=ranking,
        held_back_looks=held.looks,
        skipped=dict(skipped or {}),
    )


def judge(
    tuned: dict[str, MethodSettings], ranking: list[str], held: HeldBack, margin: float
) -> Judgement:
    """The verdict's path, recommendation and reason (``decide`` without the record)."""
    if not ranking:
        return Judgement("no method", "none", "no method was tuned")
    bound = 1.0 + margin
    left = finalists(tuned, ranking, bound)
    if not left:
        return _slower_on_search(tuned, ranking, bound)
    chosen = [n for n in left if held.measured.get(n) and held.measured[n].prompts]
    if not chosen:
        return _not_measured_held_back(tuned, left[0], held)
    return _judged(tuned, chosen, held, bound)


def _slower_on_search(tuned: dict[str, MethodSettings], ranking: list[str], bound: float):
    """No finalist: every method's search-prompt interval lies at or below ``bound``."""
    measured = [n for n in ranking if tuned[n].selection is not None]
    bar = "plain greedy decoding" if bound == 1.0 else f"{bound:.2f}x plain greedy decoding"
    reason = f"no method was faster than {bar} on the search prompts"
    if measured:
        fastest = max(measured, key=lambda n: _selection_speedup(tuned[n]))
        reason += f" (the fastest, {fastest}, ran at {_search_text(tuned[fastest])})"
    return Judgement("slower on search", "none", reason)


def _not_measured_held_back(tuned: dict[str, MethodSettings], name: str, held: HeldBack):
    """A finalist with no held-back figure: the split had no prompt, or the time ran out."""
    if held.planned == 0:
        why = "the prompts file left no held-back prompts; give a larger prompts file"
    else:
        why = "the budget ran out before the first held-back prompt; give more --budget"
    search = tuned[name].selection is not None
    ran = f" (it ran at {_search_text(tuned[name])})" if search else ""
    return Judgement(
        "not measured held back",
        "none",
        f"{name} was a finalist on the search prompts{ran}, but no held-back prompt "
        f"was measured: {why}",
    )


@dataclass(frozen=True)
class _Finalist:
    """A finalist's held-back figure, with the interval the choice among them reads."""

    name: str
    measured: Measurement
    interval: Interval
    scope: str  # how many finalists the interval is simultaneous over, said

    @property
    def held_text(self) -> str:
        return (
            f"{self.measured.speedup:.3f}x [{self.interval.low:.3f}, {self.interval.high:.3f}]"
            f"{self.scope} on {len(self.measured.prompts)} held-back prompts"
        )


def _judged(
    tuned: dict[str, MethodSettings], chosen: list[str], held: HeldBack, bound: float
) -> Judgement:
    """The recommendation among the finalists measured held back, and why."""
    scope = f" (simultaneous over {len(chosen)} finalists)" if len(chosen) > 1 else ""
    rows = [
        _Finalist(n, held.measured[n], simultaneous_interval(held.measured[n], len(chosen)), scope)
        for n in chosen
    ]
    lossy = [r for r in rows if r.measured.lossless is False]
    lossless = [r for r in rows if r.measured.lossless is not False]
    clear = [r for r in lossless if r.interval.above(bound)]
    measured_prompts = max(len(r.measured.prompts) for r in rows)
    if measured_prompts < min(MIN_PROMPTS, held.planned):
        # the run's deadline came first: too few prompts for an interval to prove
        return Judgement(
            "budget cut",
            "none",
            f"the budget ran out after {measured_prompts} of {held.planned} held-back "
            f"prompts, and fewer than {MIN_PROMPTS} prove nothing ("
            + "; ".join(f"{r.name} measured {r.held_text}" for r in rows)
            + "); give more --budget",
        )
    if clear:
        best = max(clear, key=lambda r: r.measured.speedup)
        return Judgement(
            "recommended",
            best.name,
            f"{best.name} measured {best.held_text}: its interval lies above {bound:.2f}",
        )
    differed = "; ".join(
        f"{r.name} measured {r.held_text}, but its output differed from plain greedy decoding"
        for r in lossy
    )
    if not lossless:
        return Judgement("lossy", "none", differed)
    unproven = "; ".join(_unproven_text(tuned[r.name], r) for r in lossless)
    return Judgement(
        "not proven",
        "none",
        f"{unproven}: no interval lies above {bound:.2f}" + (f"; {differed}" if lossy else ""),
    )


def _unproven_text(settings: MethodSettings, row: _Finalist) -> str:
    """A lossless finalist not proven held back, with its search figure where it has one:
    faster there, it is said to be not proven on the prompts it was not chosen on."""
    if settings.selection is None:
        return f"{row.name} measured {row.held_text}"
    return (
        f"{row.name} ran at {_search_text(settings)} on the search prompts but measured "
        f"{row.held_text}"
    )


def _search_text(settings: MethodSettings) -> str:
    """The search-prompt speedup and its interval, as the verdict quotes them."""
    figures = settings.selection
    if figures is None:
        return "no figure"
    low, high = figures.speedup_interval or [figures.speedup] * 2
    return f"{figures.speedup:.3f}x [{low:.3f}, {high:.3f}]"


def _selection_speedup(settings: MethodSettings) -> float:
    return settings.selection.speedup if settings.selection is not None else 0.0
