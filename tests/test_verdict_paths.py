"""Every way the verdict can end (``profiling.verdict.REASONS``), rendered from evidence
made here (no model), and its text checked against the figures it quotes: a "none" never
quotes a speedup above the bar as the fastest, a recommendation's interval lies above it
(issue 43: "recommended: none (no method was faster than plain greedy decoding on the
search prompts (the fastest, ngram, ran at 3.24x))")."""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from autotune.measure.stats import MIN_PROMPTS
from autotune.measure.timing import Measurement, PromptMeasurement
from autotune.profile.blocks import Environment, Figures
from autotune.profile.io import read_profile
from autotune.profiling.heldback import HeldBack
from autotune.profiling.report import verdict_lines
from autotune.profiling.verdict import REASONS, decide, judge

PROFILE = Path(__file__).parent / "data" / "profile_smollm2-135m_self_spec.yaml"
NUMBER = r"(\d+\.\d+)"
FIGURE = rf"{NUMBER}x \[{NUMBER}, {NUMBER}\]"
# "NAME measured S [L, H] ... on N held-back prompts" and "NAME ran at S [L, H]"
HELD = re.compile(rf"(\w+) measured {FIGURE}(?: \(simultaneous[^)]*\))? on (\d+) held-back")
SEARCH = re.compile(rf"(\w+),? (?:\(it )?ran at {FIGURE}")


class Settings:
    """What the verdict reads of a method's settings: its search-prompt figures."""

    def __init__(self, speedup: float | None, low: float = 0.0, high: float = 0.0):
        self.selection = (
            None
            if speedup is None
            else Figures(
                speedup=speedup,
                speedup_interval=[low, high],
                tokens_per_step=1.0,
                acceptance_rate=0.5,
                tokens_per_s=1.0,
                baseline_tokens_per_s=1.0,
                lossless=True,
                prompts=8,
            )
        )


def measured(speedup: float, prompts: int = 8, lossless: bool = True, seed: int = 0):
    """Held-back rows around ``speedup`` (5% spread), output matching or not."""
    rng = random.Random(seed)
    rows = []
    for i in range(prompts):
        greedy = 4.0 * (1 + 0.2 * rng.random())
        method = greedy / (speedup * (1 + 0.05 * rng.uniform(-1, 1)))
        rows.append(PromptMeasurement(f"p{i}", 128, greedy, 128, method, 64, 100, 60, lossless))
    return Measurement(rows)


@dataclass(frozen=True)
class Case:
    name: str
    path: str  # the REASONS key the evidence must end on
    tuned: Callable[[], dict]
    held: Callable[[], HeldBack]
    ranking: tuple[str, ...] = ("ngram",)
    margin: float = 0.0


def held(planned: int = 8, **rows: Measurement) -> HeldBack:
    return HeldBack(dict(rows), 1, "prompts", planned=planned)


CASES = [
    Case("nothing was tuned", "no method", dict, held, ranking=()),
    Case(
        "every method slower on the search prompts",
        "slower on search",
        lambda: {"ngram": Settings(0.97, 0.93, 0.99), "eagle": Settings(0.90, 0.85, 0.95)},
        lambda: held(ngram=measured(0.97)),  # the first measured for the report
        ranking=("ngram", "eagle"),
    ),
    Case(
        "faster than greedy on search, not by the margin",
        "slower on search",
        lambda: {"ngram": Settings(1.03, 1.01, 1.04)},
        held,
        margin=0.05,
    ),
    Case(
        "the issue's case: faster on search, the file left no held-back prompts",
        "not measured held back",
        lambda: {"ngram": Settings(3.24, 3.0, 3.5)},
        lambda: held(planned=0),
    ),
    Case(
        "faster on search, the budget ended before the held-back measurement",
        "not measured held back",
        lambda: {"ngram": Settings(1.4, 1.2, 1.6)},
        lambda: held(ngram=Measurement([])),
    ),
    Case(
        "the budget ran out after a few held-back prompts",
        "budget cut",
        lambda: {"ngram": Settings(1.3, 1.1, 1.5)},
        lambda: held(planned=12, ngram=measured(1.6, prompts=3)),
    ),
    Case(
        "recommended: one finalist above the bar",
        "recommended",
        lambda: {"ngram": Settings(1.3, 1.1, 1.5)},
        lambda: held(ngram=measured(1.4)),
    ),
    Case(
        "recommended among two finalists, the faster held back",
        "recommended",
        lambda: {"medusa": Settings(1.12, 0.9, 1.4), "ngram": Settings(1.1, 1.0, 1.3)},
        lambda: held(medusa=measured(0.85), ngram=measured(1.33, seed=1)),
        ranking=("medusa", "ngram"),
    ),
    Case(
        "the only finalist's output differed",
        "lossy",
        lambda: {"ngram": Settings(1.3, 1.1, 1.5)},
        lambda: held(ngram=measured(1.5, lossless=False)),
    ),
    Case(
        "faster on search, not proven held back",
        "not proven",
        lambda: {"ngram": Settings(1.3, 1.1, 1.5)},
        lambda: held(ngram=measured(0.98)),
    ),
    Case(
        "a lossy finalist clears the bar, the lossless one does not",
        "not proven",
        lambda: {"eagle": Settings(1.5, 1.3, 1.7), "ngram": Settings(1.2, 1.05, 1.3)},
        lambda: held(eagle=measured(1.6, lossless=False), ngram=measured(0.97, seed=2)),
        ranking=("eagle", "ngram"),
    ),
    Case(
        "a lone method without search figures, not proven held back",
        "not proven",
        lambda: {"ngram": Settings(None)},
        lambda: held(ngram=measured(0.99)),
    ),
]


def figures(pattern: re.Pattern, text: str) -> dict[str, tuple[float, float, float]]:
    return {m[1]: (float(m[2]), float(m[3]), float(m[4])) for m in pattern.finditer(text)}


def check_agrees(case: Case, path: str, recommended: str, reason: str) -> None:
    """The reason's quoted figures stand in the relation it states to the bar."""
    bound = 1.0 + case.margin
    held_figures, search_figures = figures(HELD, reason), figures(SEARCH, reason)
    if path == "slower on search":
        assert search_figures and all(
            s <= bound and h <= bound for s, _, h in search_figures.values()
        )
        assert not held_figures
    elif path == "not measured held back":
        assert not held_figures and "no held-back prompt was measured" in reason
        assert all(h > bound for _, _, h in search_figures.values())  # a finalist
    elif path == "budget cut":
        counts = [int(m[5]) for m in HELD.finditer(reason)]
        assert counts and max(counts) < MIN_PROMPTS and "budget ran out" in reason
    elif path == "recommended":
        low = held_figures[recommended][1]
        assert low > bound and f"lies above {bound:.2f}" in reason
        assert all(s <= held_figures[recommended][0] for s, _, _ in held_figures.values())
    elif path == "lossy":
        assert held_figures and reason.count("output differed") == len(held_figures)
    elif path == "not proven":
        lossless = [n for n in held_figures if f"{n} measured" not in _lossy_part(reason)]
        assert lossless and all(held_figures[n][1] <= bound for n in lossless)
        for name in search_figures:  # faster on search, said as such beside its held figure
            assert f"{name} ran at" in reason and "on the search prompts but measured" in reason
    if recommended == "none":
        assert "its interval lies above" not in reason
    else:
        assert path == "recommended"


def _lossy_part(reason: str) -> str:
    return "; ".join(part for part in reason.split("; ") if "output differed" in part)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_verdict_text_agrees_with_its_figures(case: Case):
    tuned, ranking = case.tuned(), list(case.ranking)
    judgement = judge(tuned, ranking, case.held(), case.margin)  # type: ignore[arg-type]
    assert judgement.path == case.path, judgement
    check_agrees(case, judgement.path, judgement.recommended, judgement.reason)
    verdict = decide(tuned, ranking, case.held(), case.margin)  # type: ignore[arg-type]
    assert (verdict.recommended, verdict.reason) == (judgement.recommended, judgement.reason)
    # rendered as a user reads it: the last line says what decide said, nothing else
    profile = read_profile(PROFILE).model_copy(
        update={"recommended": verdict.recommended, "verdict": verdict}
    )
    lines = verdict_lines(profile)
    assert lines[-1] == f"recommended: {verdict.recommended} ({verdict.reason})"


def test_every_path_of_the_verdict_is_rendered_here():
    """A new way for the verdict to end needs a case above."""
    assert {c.path for c in CASES} == set(REASONS)


def test_a_busy_machine_is_said_beside_a_verdict_that_still_agrees():
    case = next(c for c in CASES if c.path == "recommended")
    verdict = decide(case.tuned(), list(case.ranking), case.held(), 0.0)  # type: ignore[arg-type]
    noise = {"busy": True, "reasons": ["2 other processes used the CPU"]}
    profile = read_profile(PROFILE).model_copy(
        update={
            "recommended": verdict.recommended,
            "verdict": verdict,
            "environment": Environment(noise=noise),
        }
    )
    lines = verdict_lines(profile)
    assert "the machine was busy while timing: 2 other processes used the CPU" in lines
    assert lines[-1] == f"recommended: ngram ({verdict.reason})"
    check_agrees(case, "recommended", verdict.recommended, verdict.reason)
