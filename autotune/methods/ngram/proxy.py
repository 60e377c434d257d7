"""The n-gram tuning's proxy search: for each kind (prompt lookup, suffix decoding)
coordinate ascent over its grids, scored by the exact replay of drafting along the
calibration continuations (``replay``), from the engines' defaults; then the same from
each kind's winner on each category's continuations alone. Run once per process: the
probe runs it, the tuning that follows reuses it."""

from __future__ import annotations

import functools
import hashlib
import itertools
from dataclasses import dataclass, field

from autotune.methods import registry
from autotune.methods.base import TuneContext
from autotune.methods.ngram import engines
from autotune.methods.ngram.calibration import KINDS, grids, start_config
from autotune.methods.ngram.replay import Continuation, Replayer
from autotune.methods.ngram.search import Scored, ascend
from autotune.methods.ngram.settings import Config, block_of, describe
from autotune.methods.ngram.space import NgramSpace
from autotune.progress import say, step


@dataclass
class Proxy:
    """What the proxy search found."""

    best: dict[str, Config]  # kind -> best on every calibration continuation
    predicted: dict[str, float]  # kind -> its predicted speedup
    finalists: list[Config]  # each kind's best distinct settings, the kinds in turn
    by_category: dict[str, Config] = field(default_factory=dict)  # category -> its best
    rows: dict[str, dict] = field(default_factory=dict)  # category -> what it predicted

    def record(self, replayer: Replayer) -> dict:
        """Each kind's best and what the proxy predicted for it, for the ``search``
        record."""
        return {
            k: {
                "best": block_of(self.best[k]).model_dump(),
                "predicted_speedup": round(self.predicted[k], 4),
                "predicted_tokens_per_step": round(
                    replayer.tokens_per_step(self.best[k], replayer.indices()), 4
                ),
            }
            for k in KINDS
        }


def cached_proxy(ctx: TuneContext, replayer: Replayer, sequences: list[Continuation]) -> Proxy:
    """The proxy search on these continuations, once per process (the probe runs it, the
    tuning that follows reuses it)."""
    from autotune.process_cache import cached

    return cached(_search_key("ngram_proxy", ctx, sequences), lambda: proxy_search(ctx, replayer))


def cached_engine_search(
    ctx: TuneContext, replayer: Replayer, sequences: list[Continuation], only: list[str]
) -> dict[str, engines.Found]:
    """``--engine``: the engines' own rules searched on the proxy from transformers'
    default, once per process (the probe runs it, the tuning that follows reuses it)."""
    from autotune.process_cache import cached

    return cached(
        (*_search_key("ngram_engines", ctx, sequences), tuple(only)),
        lambda: engines.search_all(
            ctx.space, replayer, [start_config(ctx.space, "ngram")], only, ctx.budget.spent
        ),
    )


def _search_key(name: str, ctx: TuneContext, sequences: list[Continuation]) -> tuple:
    digest = hashlib.sha256(repr([(s.prompt, s.tokens) for s in sequences]).encode())
    return (name, digest.hexdigest(), ctx.space.model_dump_json())


def proxy_search(ctx: TuneContext, replayer: Replayer) -> Proxy:
    space: NgramSpace = ctx.space
    budget = ctx.budget.part(registry.time_share("ngram", "proxy search"))
    everything = replayer.indices()
    best, predicted, ranked = {}, {}, []
    for kind in KINDS:
        scored = Scored(functools.partial(replayer.speedup, indices=everything))
        with step(f"n-gram proxy search: {kind}", 1) as advance:
            best[kind] = ascend(
                start_config(space, kind),
                grids(space, kind),
                scored,
                space.search.passes,
                budget.spent,
            )
            advance()
        predicted[kind] = scored(best[kind])
        ranked.append([config for config, _ in scored.best(space.search.finalists)])
        say(f"{kind}: predicted {predicted[kind]:.3f}x with {describe(best[kind])}")
    # the kinds in turn, so that a small trial budget measures both
    finalists = [c for row in itertools.zip_longest(*ranked) for c in row if c is not None]
    proxy = Proxy(best, predicted, finalists)
    if len(replayer.categories()) > 1:
        proxy.by_category, proxy.rows = category_search(space, replayer, best, budget)
    if budget.spent():
        ctx.note("the n-gram proxy search stopped at its share of the time budget")
    return proxy


def category_search(
    space: NgramSpace, replayer: Replayer, best: dict[str, Config], budget
) -> tuple[dict[str, Config], dict[str, dict]]:
    """Each category's best setting (either kind), from each kind's global winner
    (``best``), on the category's continuations alone; and what each predicted."""
    by_category: dict[str, Config] = {}
    rows: dict[str, dict] = {}
    for category in replayer.categories():
        indices = replayer.indices(category)
        found = {}
        for kind in KINDS:
            scored = Scored(functools.partial(replayer.speedup, indices=indices))
            config = ascend(
                best[kind], grids(space, kind), scored, space.search.passes, budget.spent
            )
            found[config] = scored(config)
        own = max(found, key=lambda c: found[c])
        by_category[category] = own
        rows[category] = {
            "best": block_of(own).model_dump(),
            "predicted_speedup": round(found[own], 4),
            "global_predicted": {k: round(replayer.speedup(best[k], indices), 4) for k in KINDS},
        }
    return by_category, rows
