"""The verdict's rules, in one place: the fastest finalist on the held-back prompts whose
simultaneous interval (over the finalists and the looks) clears 1 + margin and whose
output matched plain greedy decoding is recommended; otherwise none, with the reason."""

from __future__ import annotations

from autotune.measure.stats import MIN_PROMPTS
from autotune.measure.timing import Measurement
from autotune.profile.blocks import MethodSettings, Verdict
from autotune.profiling.heldback import HeldBack
from autotune.profiling.select import finalists


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
    verdict = Verdict(
        recommended="none",
        reason="",
        margin=margin,
        ranking=ranking,
        held_back_looks=held.looks,
        skipped=dict(skipped or {}),
    )
    if not ranking:
        verdict.reason = "no method was tuned"
        return verdict
    bound = 1.0 + margin
    chosen = [n for n in finalists(tuned, ranking, bound) if held.measured.get(n)]
    chosen = [n for n in chosen if held.measured[n].prompts]
    if not chosen:
        top = ranking[0]
        verdict.reason = (
            f"no method was faster than plain greedy decoding on the search "
            f"prompts (the fastest, {top}, ran at "
            f"{_selection_speedup(tuned[top]):.3f}x)"
        )
        return verdict
    verdict.recommended, verdict.reason = _judged(chosen, held, bound)
    return verdict


def _judged(chosen: list[str], held: HeldBack, bound: float) -> tuple[str, str]:
    """The recommendation among the finalists measured held back, and why."""
    among = len(chosen)
    rows = {n: (held.measured[n], simultaneous_interval(held.measured[n], among)) for n in chosen}
    scope = f" (simultaneous over {among} finalists)" if among > 1 else ""

    def text(name: str) -> str:
        measured, interval = rows[name]
        return (
            f"{name} measured {measured.speedup:.3f}x [{interval.low:.3f}, {interval.high:.3f}]"
            f"{scope} on {len(measured.prompts)} held-back prompts"
        )

    clear = [n for n in chosen if rows[n][0].lossless is not False and rows[n][1].above(bound)]
    lossy = [n for n in chosen if rows[n][0].lossless is False]
    measured_prompts = max(len(held.measured[n].prompts) for n in chosen)
    if measured_prompts < min(MIN_PROMPTS, held.planned):
        # the run's deadline came first: too few prompts for an interval to prove
        return "none", (
            "; ".join(text(n) for n in chosen)
            + f": the budget ran out after {measured_prompts} of "
            f"{held.planned} held-back prompts, and fewer than {MIN_PROMPTS} prove nothing; "
            "give more --budget"
        )
    if clear:
        best = max(clear, key=lambda n: rows[n][0].speedup)
        return best, f"{text(best)}: its interval lies above {bound:.2f}"
    if lossy and len(lossy) == len(chosen):
        return "none", f"{text(lossy[0])}, but its output differed from plain greedy decoding"
    return "none", "; ".join(text(n) for n in chosen) + f": no interval clears {bound:.2f}"


def _selection_speedup(settings: MethodSettings) -> float:
    return settings.selection.speedup if settings.selection is not None else 0.0
