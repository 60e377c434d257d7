"""Each serving engine's own n-gram setting: what the export to that engine writes.

The engines draft one chain by their own matching rule (``drafters.engine_lookup``), so
the profile's setting (a tree, suffix decoding, a guess where nothing matches) is not
what they would run. For each engine with a rule: coordinate ascent on the proxy
(``replay``, exact for any rule) over the options the engine has, from the profile's
proxy bests and the engine's default projected onto them; then the best few decoded
against greedy on search prompts, and the fastest kept with its figures.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from autotune.drafters.engine_lookup import ENGINES, EngineLookupConfig
from autotune.drafters.suffix import SuffixConfig
from autotune.measure.timing import Measurement
from autotune.methods.ngram.replay import Replayer
from autotune.methods.ngram.search import Scored, ascend
from autotune.methods.ngram.settings import Config, block_of, describe
from autotune.methods.ngram.space import NgramSpace
from autotune.profile.blocks import EngineVariant, Figures
from autotune.progress import say, step

# The engines' own defaults, where their sources set both options (transformers' is the
# search space's start: ``space.yaml``).
DEFAULTS = {"llamacpp": EngineLookupConfig("llamacpp", 12, 12, 48)}


@dataclass(frozen=True)
class Found:
    """One engine's proxy search: its best settings, best first, with predictions."""

    engine: str
    ranked: list[tuple[EngineLookupConfig, float]]

    @property
    def best(self) -> EngineLookupConfig:
        return self.ranked[0][0]


def rule_engines(asked: Iterable[str] | None) -> list[str]:
    """The engines with a rule of their own, among ``asked`` (all of them for None)."""
    return [e for e in ENGINES if asked is None or e in asked]


def project(config: Config, engine: str) -> EngineLookupConfig:
    """The nearest setting ``engine`` can express: the same longest match and the
    chain's length; the rest as its rule fixes it."""
    length = min(config.draft_tokens, config.max_tree_tokens)
    prefer = "first" if isinstance(config, SuffixConfig) else config.prefer
    return EngineLookupConfig(engine, config.min_match, config.max_match, length, prefer)  # type: ignore[arg-type]


def grids(space: NgramSpace, engine: str) -> dict[str, list]:
    """The options ``engine`` has, over the search space's values."""
    grid = space.ngram
    out: dict[str, list] = {"max_match": list(grid.max_match)}
    if engine == "vllm":
        out["min_match"] = list(grid.min_match)
    out["draft_tokens"] = list(grid.draft_tokens)
    if engine == "trtllm":
        out["prefer"] = list(grid.prefer)
    return out


def search(
    space: NgramSpace,
    replayer: Replayer,
    engine: str,
    seeds: Sequence[Config],
    out_of_time=lambda: False,
) -> Found:
    """Coordinate ascent from each seed projected onto ``engine`` (and its default)."""
    scored = Scored(functools.partial(replayer.speedup, indices=replayer.indices()))
    starts = dict.fromkeys([project(s, engine) for s in seeds])
    if engine in DEFAULTS:
        starts[DEFAULTS[engine]] = None
    for start in starts:
        ascend(start, grids(space, engine), scored, space.search.passes, out_of_time)
    return Found(engine, scored.best(max(1, space.search.finalists)))


def variants_of(
    found: dict[str, Found], measured: Mapping[Config, Measurement], finalists: int = 1
) -> dict[str, EngineVariant]:
    """Each engine's fastest measured finalist (its proxy best where none was decoded)."""
    out = {}
    for engine, f in found.items():
        rows = [(c, p, measured.get(c)) for c, p in f.ranked[:finalists]]
        decoded = [r for r in rows if r[2] is not None and r[2].prompts]
        config, predicted, m = (
            max(decoded, key=lambda r: r[2].speedup) if decoded else rows[0]  # type: ignore[union-attr]
        )
        out[engine] = EngineVariant(
            setting=block_of(config).model_dump(),
            description=describe(config),
            predicted=round(predicted, 4),
            selection=Figures(**m.summary(False)) if m is not None and m.prompts else None,
        )
        figure = f"{m.speedup:.3f}x measured" if m is not None and m.prompts else "unmeasured"
        say(f"n-gram as {engine} drafts: {describe(config)}: {figure}, predicted {predicted:.3f}x")
    return out


def search_all(
    space: NgramSpace,
    replayer: Replayer,
    seeds: Sequence[Config],
    engines: Sequence[str],
    out_of_time=lambda: False,
) -> dict[str, Found]:
    """``search`` for each of ``engines``."""
    if not engines:
        return {}
    with step(f"n-gram proxy search as {', '.join(engines)} draft", len(engines)) as advance:
        found = {}
        for engine in engines:
            found[engine] = search(space, replayer, engine, seeds, out_of_time)
            advance()
    return found
