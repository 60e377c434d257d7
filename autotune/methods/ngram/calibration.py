"""The n-gram tuning's calibration: the search prompts split between timing and the
proxy, the target's greedy continuations the proxy replays, this device's verify-latency
curve and what one proposal of each kind costs; and the two kinds' grids and starts."""

from __future__ import annotations

from dataclasses import dataclass

from autotune.drafters.ngram import LookupConfig
from autotune.drafters.suffix import SuffixConfig
from autotune.errors import AutotuneError
from autotune.measure.costs import LatencyCurve
from autotune.measure.timing import EncodedPrompt, categories_in_turn
from autotune.methods.base import TuneContext
from autotune.methods.ngram.replay import Continuation, Costs, Replayer, time_drafting
from autotune.methods.ngram.settings import Config
from autotune.methods.ngram.space import NgramSpace
from autotune.progress import say

KINDS = ("ngram", "suffix")
# Continuations whose replay times one proposal of each kind.
TIMED_SEQUENCES = 4


@dataclass(frozen=True)
class Calibration:
    """What the probe and the tuning start from."""

    confirm: list[EncodedPrompt]  # search prompts for wall-clock measurement
    sequences: list[Continuation]  # greedy continuations of other search prompts
    curve: LatencyCurve  # this device's verify latency
    replayer: Replayer  # the proxy on ``sequences``
    draft_seconds: dict[str, float]  # kind -> one proposal's measured cost

    def record(self, ctx: TuneContext) -> dict:
        """The calibration's part of the settings' ``search`` record (its ``seconds``: the
        tuning's, so far)."""
        return {
            "calibration": {
                "continuations": len(self.sequences),
                "confirm_prompts": len(self.confirm),
            },
            "draft_seconds": {k: round(v, 6) for k, v in self.draft_seconds.items()},
            **ctx.workspace.verify_record(self.curve),
            "seconds": round(ctx.budget.elapsed(), 1),
        }


def calibrate(ctx: TuneContext) -> Calibration:
    """The split, the verify curve as far as the largest tree reaches, and the proxy."""
    confirm, sequences = split_search(ctx)
    curve = ctx.workspace.verify_curve(largest_tree(ctx.space) + 1)
    replayer, draft_seconds = make_replayer(ctx, sequences, curve)
    return Calibration(confirm, sequences, curve, replayer, draft_seconds)


def split_search(ctx: TuneContext) -> tuple[list[EncodedPrompt], list[Continuation]]:
    """Search prompts for wall-clock measurement, and the greedy continuations of other
    search prompts for the proxy: no prompt is timed that the proxy was fitted on."""
    space: NgramSpace = ctx.space
    ws = ctx.workspace
    search = ws.encode(ws.search_prompts())
    confirm = categories_in_turn(search, space.trials.prompts)
    rest = [p for p in search if p not in confirm] or search
    chosen = categories_in_turn(rest, space.calibration.prompts)
    category = {tuple(p.ids): p.category for p in chosen}
    tokens = space.calibration.tokens
    sequences = [
        Continuation(tuple(ids), tuple(cont), tokens, category.get(tuple(ids)))
        for ids, cont in ws.continuations(chosen, tokens)
    ]
    if not sequences:
        raise AutotuneError(
            "no search prompt gave a continuation to tune n-gram drafting on: pass "
            "--prompts with more prompts, or a larger --max-new-tokens"
        )
    return confirm, sequences


def make_replayer(
    ctx: TuneContext, sequences: list[Continuation], curve: LatencyCurve
) -> tuple[Replayer, dict[str, float]]:
    """The proxy, with the verify curve and one proposal's measured cost per kind."""
    space: NgramSpace = ctx.space
    starts = {kind: start_config(space, kind) for kind in KINDS}
    seconds = {
        kind: time_drafting(config, sequences[:TIMED_SEQUENCES]) for kind, config in starts.items()
    }
    say(
        f"one target forward {curve(1) * 1e3:.1f} ms; one proposal: prompt lookup "
        f"{seconds['ngram'] * 1e3:.2f} ms, suffix {seconds['suffix'] * 1e3:.2f} ms"
    )
    costs = {kind: Costs(curve, s) for kind, s in seconds.items()}
    return Replayer(sequences, lambda config: costs[kind_of(config)]), seconds


def largest_tree(space: NgramSpace) -> int:
    """The most tokens a step may verify (the root not counted): the curve's reach."""
    return max(
        *space.ngram.max_tree_tokens,
        *space.suffix.max_tree_tokens,
        space.ngram.start.max_tree_tokens,
        space.suffix.start.max_tree_tokens,
    )


def kind_of(config: Config) -> str:
    """Whose proposal cost a setting pays (an engine's rule: prompt lookup's)."""
    return "suffix" if isinstance(config, SuffixConfig) else "ngram"


def start_config(space: NgramSpace, kind: str) -> Config:
    if kind == "ngram":
        return LookupConfig(**space.ngram.start.model_dump())
    return SuffixConfig(**space.suffix.start.model_dump())


def grids(space: NgramSpace, kind: str) -> dict[str, list]:
    grid = space.ngram if kind == "ngram" else space.suffix
    return {name: list(values) for name, values in grid if name != "start"}
