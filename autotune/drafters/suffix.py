"""Suffix decoding (SuffixDecoding, Oliaro et al. 2024) over one sequence: the longest
suffix of the sequence (up to ``max_match`` tokens) that occurred before selects the
earlier occurrences it matches; their continuations are counted into a frequency tree,
and the most frequent branches are drafted, in a tree whose size grows with the match
length. It shares the index and the tree merge of ``drafters.ngram``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from autotune.drafters.ngram import Candidates, TokenIndex, check_match


@dataclass(frozen=True)
class SuffixConfig:
    """``min_match``: the shortest suffix that may match (the index's key length);
    ``max_match``: the longest considered. With a match of length m the tree holds at
    most ``tokens_per_match`` x m nodes (and ``max_tree_tokens``), each continuation at
    most ``draft_tokens`` deep, and only nodes that at least ``min_probability`` of the
    matching occurrences pass through (vLLM's ``suffix_decoding_max_spec_factor`` and
    ``suffix_decoding_min_token_prob``)."""

    min_match: int
    max_match: int
    draft_tokens: int
    max_tree_tokens: int
    tokens_per_match: float
    min_probability: float

    guesses: ClassVar[bool] = True

    def __post_init__(self):
        check_match(self.min_match, self.max_match)
        if min(self.draft_tokens, self.max_tree_tokens) < 1:
            raise ValueError("draft_tokens and max_tree_tokens are >= 1")
        if self.tokens_per_match <= 0 or not 0 <= self.min_probability <= 1:
            raise ValueError("need tokens_per_match > 0 and 0 <= min_probability <= 1")

    def candidates_for(self, index: TokenIndex, depth: int) -> Candidates:
        ends = index.earlier_ends()
        if not ends:
            return Candidates()
        lengths = [index.match_length(end, self.max_match) for end in ends]
        longest = max(lengths)
        length = min(self.draft_tokens, depth)
        paths = [
            (index.continuation(end, length), 1.0)
            for end, matched in zip(ends, lengths)
            if matched == longest
        ]
        budget = min(self.max_tree_tokens, max(1, math.floor(self.tokens_per_match * longest)))
        return Candidates(paths, budget, self.min_probability)
