"""Serving engines' own prompt lookup, as policies of ``drafters.ngram``: what each engine
drafts with its n-gram options, so that the setting exported to it is tuned and measured
as it will run there, not as autotune's wider drafter would run it.

Every engine drafts one chain, copied from the sequence up to its end (no wrap-around),
and nothing at all where no match qualifies. Their rules, from their sources at the
releases ``export.releases`` pins:

- ``hf`` (``PromptLookupCandidateGenerator``): n-gram sizes from ``max_match`` down to
  1; the earliest occurrence of the largest size that has a token after it.
- ``vllm`` (``NgramProposer``): the longest match between ``min_match`` and
  ``max_match`` tokens, its earliest occurrence.
- ``trtllm`` (``NGramDecodingConfig``): sizes from ``max_match`` down to 1; the oldest
  or the most recent occurrence (``is_use_oldest``). Its pool keeps continuations per
  pattern as they arrive; the rule here drafts from the sequence itself (its
  ``is_keep_all`` pool holds those same continuations).
- ``llamacpp`` (``ngram-simple``): exactly ``max_match`` tokens matched, the most recent
  occurrence that ends at least two tokens back and does not start the sequence; the
  tokens after it up to, not including, the last one; only when at least ``max_match``
  of them are there, and only once the sequence is longer than n + m + 2.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from autotune.drafters.ngram import Candidates, Path, TokenIndex, check_match

EngineName = Literal["hf", "vllm", "trtllm", "llamacpp"]
ENGINES: tuple[EngineName, ...] = ("hf", "vllm", "trtllm", "llamacpp")


@dataclass(frozen=True)
class EngineLookupConfig:
    """One engine's prompt lookup: match ``min_match``..``max_match`` tokens, draft
    ``draft_tokens``. Options the engine does not have are fixed by its rule (set here
    whatever was given, so that a search may vary the others freely): hf and trtllm
    match down to one token, llama.cpp exactly ``max_match``; hf and vLLM take the
    earliest occurrence, llama.cpp the most recent."""

    engine: EngineName
    min_match: int
    max_match: int
    draft_tokens: int
    prefer: Literal["recent", "first"] = "first"

    # no guess where nothing matches: the engines draft nothing then
    guesses: ClassVar[bool] = False
    candidates: ClassVar[int] = 1  # a chain

    def __post_init__(self):
        if self.engine not in ENGINES:
            raise ValueError(f"no lookup rule for engine {self.engine!r}: one of {ENGINES}")
        fixed: dict[str, object] = {
            "hf": {"min_match": 1, "prefer": "first"},
            "vllm": {"prefer": "first"},
            "trtllm": {"min_match": 1},
            "llamacpp": {"min_match": self.max_match, "prefer": "recent"},
        }[self.engine]  # type: ignore[assignment]
        for name, value in fixed.items():
            object.__setattr__(self, name, value)
        check_match(self.min_match, self.max_match)
        if self.draft_tokens < 1:
            raise ValueError("draft_tokens is >= 1")
        if self.prefer not in ("recent", "first"):
            raise ValueError("prefer is 'recent' or 'first'")

    @property
    def max_tree_tokens(self) -> int:
        return self.draft_tokens

    def candidates_for(self, index: TokenIndex, depth: int) -> Candidates:
        length = min(self.draft_tokens, depth)
        path = self._llamacpp(index, length) if self.engine == "llamacpp" else self._longest(index)
        return Candidates([(path[:length], 1.0)] if path else [], self.draft_tokens)

    def _longest(self, index: TokenIndex) -> Path:
        """The tokens after the longest match (capped at ``max_match``), its earliest or
        most recent occurrence, up to the sequence's end."""
        ends = index.all_earlier_ends(oldest_first=self.prefer == "first")
        if not ends:
            return ()
        # min() keeps the first of equally long matches: the preferred occurrence
        best = min(ends, key=lambda end: -index.match_length(end, self.max_match))
        return tuple(index.tokens[best + 1 : best + 1 + self.draft_tokens])

    def _llamacpp(self, index: TokenIndex, length: int) -> Path:
        n, m = self.max_match, self.draft_tokens
        size = len(index.tokens)  # llama.cpp's tokens and the sampled last one
        if size - 1 <= n + m + 1:
            return ()
        for end in index.all_earlier_ends():
            if end > size - 3 or end - n + 1 < 1:
                continue
            copy = min(m, size - 2 - end)
            return tuple(index.tokens[end + 1 : end + 1 + copy]) if copy >= n else ()
        return ()
