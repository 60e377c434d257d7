"""Draft-free speculation: the draft is copied from the prompt and the output so far
(prompt lookup, several matches merged into a token tree; or suffix decoding, a
frequency-weighted tree after the longest match). Tuned on measured speed: the kind,
the match lengths, the draft depth, the number of candidates and the tree size, and,
where it measures clearly faster, a setting of its own per workload category."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, ClassVar

from autotune.methods.base import DraftEnv, Method
from autotune.methods.ngram.export import CANNOT, EXPORTERS
from autotune.methods.ngram.settings import EngineLookup, NgramLookup, NgramSettings, SuffixLookup
from autotune.methods.ngram.space import NgramSpace


class Ngram(Method):
    name = "ngram"
    title = "n-gram lookup (draft-free)"
    summary = (
        "drafts by copying what followed earlier occurrences of the last tokens (prompt "
        "lookup trees, suffix decoding); needs no trained weights"
    )
    settings_model: ClassVar = NgramSettings
    space_model: ClassVar = NgramSpace
    chain = False
    draft_free = True
    # the proxy's search, then the measured study (the rest: the side by side of its
    # finalists and of each serving engine's own setting)
    time_shares: ClassVar = {"proxy search": 0.4, "measured study": 0.75}
    probes = True
    exporters: ClassVar = EXPORTERS
    cannot_export: ClassVar = CANNOT

    def tuning_seconds(self, space: NgramSpace, forward_s: float, trials: int) -> float:
        from autotune.methods.ngram.tune import tuning_seconds

        return tuning_seconds(space, forward_s, trials)

    def for_engine(self, settings: NgramSettings, engine: str) -> NgramSettings:
        """The engine's own setting, drafting as it drafts, with its own figures."""
        variant = settings.engines.get(engine)
        if variant is None:
            return settings
        return settings.model_copy(
            update={
                "draft": EngineLookup.model_validate(variant.setting),
                "by_category": {},  # one setting per server (per-category: said in notes)
                "alternatives": {},
                # figures from the engine itself, where it was tuned there
                "selection": variant.served or variant.selection,
                "measured": None if variant.served else variant.measured,
                "engines": {},
                "search": {"tuned_in": variant.tuned_in} if variant.tuned_in else {},
            }
        )

    def drafter(self, settings: NgramSettings, env: DraftEnv):
        from autotune.drafters.ngram import NgramDrafter

        return functools.partial(NgramDrafter, settings.config())

    def variant(self, settings: NgramSettings, env: DraftEnv):
        """The global setting, and each category's own where the profile keeps one."""
        from autotune.drafters.ngram import NgramDrafter
        from autotune.measure.timing import Variant

        return Variant(
            self.drafter(settings, env),
            {
                category: functools.partial(NgramDrafter, config)
                for category, config in settings.category_configs().items()
            },
        )

    def examples(self, model: Any, folder: Path) -> dict[str, NgramSettings]:
        tree = NgramLookup(
            min_match=1,
            max_match=3,
            draft_tokens=5,
            candidates=3,
            branch_tokens=2,
            max_tree_tokens=9,
            prefer="recent",
        )
        chain = NgramLookup(
            min_match=2,
            max_match=2,
            draft_tokens=4,
            candidates=1,
            branch_tokens=1,
            max_tree_tokens=4,
            prefer="first",
        )
        suffix = SuffixLookup(
            min_match=1,
            max_match=4,
            draft_tokens=6,
            max_tree_tokens=8,
            tokens_per_match=2.0,
            min_probability=0.1,
        )
        llamacpp = EngineLookup(
            engine="llamacpp", min_match=2, max_match=2, draft_tokens=4, prefer="recent"
        )
        return {
            "lookup_tree": NgramSettings(draft=tree),
            "llamacpp_rule": NgramSettings(draft=llamacpp),
            "lookup_chain": NgramSettings(draft=chain),
            "suffix": NgramSettings(draft=suffix),
            "by_category": NgramSettings(draft=tree, by_category={"copy": suffix}),
        }


ENTRY = Ngram()
