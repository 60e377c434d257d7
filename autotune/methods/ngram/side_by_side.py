"""The n-gram tuning's last step, with fresh timings on the same search prompts: the
candidates (the two kinds' winners, the default the search started from, the engines' own
rules) and every category with its own setting, side by side. The fastest is the setting;
a category keeps its own only where, on its prompts, it beat that setting clearly
(``per_category``)."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field

from autotune.drafters.ngram import NgramDrafter
from autotune.errors import AutotuneError
from autotune.measure.stats import Pairs, bootstrap_interval
from autotune.measure.timing import (
    MIN_PROMPTS,
    EncodedPrompt,
    Measurement,
    Variant,
    measure_variants,
)
from autotune.methods.base import TuneContext
from autotune.methods.ngram.calibration import start_config
from autotune.methods.ngram.settings import Config, block_of
from autotune.methods.ngram.space import NgramSpace, PerCategory
from autotune.profile.blocks import Figures
from autotune.progress import step


@dataclass(frozen=True)
class Race:
    """What the side by side decided."""

    chosen: str  # the fastest candidate's name
    selection: dict[str, float] = field(default_factory=dict)  # candidate -> speedup
    verdicts: dict[str, dict] = field(default_factory=dict)  # category -> kept or not, why
    figures: Figures | None = None  # the chosen one's
    measured: dict[str, Measurement] = field(default_factory=dict)  # every variant's


def with_default(space: NgramSpace, winners: dict[str, Config]) -> dict[str, Config]:
    """Each kind's winner and, unless it is one of them, the default the search started
    from (transformers' prompt lookup): the setting never measures slower than it."""
    default = start_config(space, "ngram")
    if default in winners.values():
        return dict(winners)
    return {**winners, "default": default}


def side_by_side(
    ctx: TuneContext,
    candidates: dict[str, Config],
    by_category: dict[str, Config],
    prompts: list[EncodedPrompt],
) -> Race:
    """The fastest candidate, each one's speedup, the verdict on every category's own
    setting, the chosen one's figures and every measurement: all decoded side by side on
    the same search prompts."""
    space: NgramSpace = ctx.space
    variants = drafting_variants(candidates)
    if by_category:
        variants["per_category"] = Variant(
            variants["ngram"].make,
            {c: functools.partial(NgramDrafter, config) for c, config in by_category.items()},
        )
    label = "n-gram: the candidates and per-category settings side by side (search prompts)"
    measured = measure_in_step(ctx, label, variants, prompts, space.trials.tokens)
    lost = {name: m.first_loss() for name, m in measured.items() if m.lossless is False}
    if lost:
        name, where = next(iter(lost.items()))
        raise AutotuneError(
            f"n-gram drafting ({name}) changed the greedy output ({where}), which it must "
            "never do: please report this as a bug (with the model and prompts)"
        )
    selection = {k: round(measured[k].speedup, 4) for k in candidates}
    chosen = max(candidates, key=lambda k: selection[k])  # a tie keeps the earlier
    verdicts = {}
    if by_category:
        verdicts = category_verdicts(
            measured["per_category"],
            measured[chosen],
            by_category,
            candidates[chosen],
            space.per_category,
        )
    # the chosen setting's figures: the profile's selection when no other method is left
    # to compare it with
    return Race(chosen, selection, verdicts, Figures(**measured[chosen].summary(False)), measured)


@dataclass(frozen=True)
class Entrants:
    """What a side by side decodes, cut to the time it has."""

    candidates: dict[str, Config]  # the settings racing for the choice
    by_category: dict[str, Config]  # each category's own (empty: none is judged)
    left_out: list[str]  # what no time was left to measure, by name


def entrants(
    required: Mapping[str, Config],
    optional: Mapping[str, Config],
    by_category: Mapping[str, Config],
    prompt_s: float,
    left: float | None,
) -> Entrants | None:
    """What the side by side can decode on its least prompts (``MIN_PROMPTS``) in the
    ``left`` seconds (None: no limit), one greedy prompt taking about ``prompt_s``: every
    one of ``required``, then as many of ``optional`` as fit, in their order, then the
    per-category setting (one more decoding of each prompt) if it fits; None where not
    even ``required`` fits. Its least prompts are decoded whatever the budget says (a
    setting needs a measurement to be chosen by), so on a busy machine, where a forward
    can take four times as long, what they cost is what decides how far past its share
    the tuning runs."""
    from autotune.plan import DRAFT_FREE_COST

    def fits(decoders: int) -> bool:
        needed = MIN_PROMPTS * prompt_s * (1 + DRAFT_FREE_COST * decoders)  # 1: greedy's
        return left is None or needed <= left

    if not fits(len(required)):
        return None
    kept, left_out = dict(required), []
    for name, config in optional.items():
        if name in kept:
            continue
        if fits(len(kept) + 1):
            kept[name] = config
        else:
            left_out.append(name)
    judged = dict(by_category) if by_category and fits(len(kept) + 1) else {}
    if by_category and not judged:
        left_out.append("per-category settings")
    return Entrants(kept, judged, left_out)


def drafting_variants(settings: dict[str, Config]) -> dict[str, Variant]:
    """Each named setting as a variant to decode."""
    return {name: Variant(functools.partial(NgramDrafter, c)) for name, c in settings.items()}


def measure_in_step(
    ctx: TuneContext,
    label: str,
    variants: dict[str, Variant],
    prompts: list[EncodedPrompt],
    max_new_tokens: int,
    least: int = MIN_PROMPTS,
) -> dict[str, Measurement]:
    """``variants`` decoded side by side on ``prompts``, shown as one step; no prompt is
    started once the tuning's budget is spent, after the first ``least``."""
    with step(label, len(prompts) * len(variants)) as advance:
        return measure_variants(
            ctx.workspace.runner,
            variants,
            prompts,
            max_new_tokens,
            on_prompt=lambda _: advance(),
            until=ctx.budget,
            least=least,
        )


def category_verdicts(
    own: Measurement,
    chosen: Measurement,
    candidates: dict[str, Config],
    setting: Config,
    rule: PerCategory,
) -> dict[str, dict]:
    """Whether each category keeps its own setting: on its prompts, its own setting's
    speed over the chosen one's (paired by prompt) must be at least 1 + ``min_gain`` and
    the paired-bootstrap interval's low end above 1.0."""
    verdicts: dict[str, dict] = {}
    for category, config in candidates.items():
        if config == setting:
            verdicts[category] = {"kept": False, "why": "the same as the global setting"}
            continue
        rows = [
            (o.method_seconds, o.method_tokens, c.method_seconds, c.method_tokens)
            for o, c in zip(own.prompts, chosen.prompts)
            if o.category == category
        ]
        if not rows:
            verdicts[category] = {"kept": False, "why": "none of its prompts was measured"}
            continue
        pairs = Pairs.of(rows)
        gain, interval = pairs.speedup(), bootstrap_interval(pairs, rule.confidence)
        verdicts[category] = {
            "kept": bool(gain >= 1.0 + rule.min_gain and interval.above(1.0)),
            "speedup_vs_global": round(float(gain), 4),
            "interval": interval.as_list(),
            "prompts": len(rows),
            "setting": block_of(config).model_dump(),
        }
    return verdicts
