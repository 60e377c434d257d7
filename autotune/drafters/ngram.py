"""Draft-free speculation: the draft is copied from the sequence itself.

The last tokens of the sequence (prompt and output so far) are looked up among its earlier
tokens; what followed an earlier occurrence is proposed as the continuation. Several
occurrences give several candidate continuations, merged into one token tree (shared
prefixes once), so that more than one continuation is verified per step. Two policies
choose the candidates: prompt lookup (``LookupConfig``, here) ranks occurrences by match
length, then recency; suffix decoding (``drafters.suffix``) weighs continuations by how
often they follow the longest match. Both read one per-sequence index (``TokenIndex``)
that grows with the sequence, so a step costs what it adds, not a scan of the history.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Literal, Protocol

from autotune.engine.proposal import Draft, DraftContext, Drafter
from autotune.engine.tree import ROOT, TreeShape

# Earlier occurrences examined per step: bounds the cost of a common key (a comma, "the")
# in a long history; the most recent (or the oldest, see ``LookupConfig.prefer``) win.
MAX_SCAN = 128

Path = tuple[int, ...]


class TokenIndex:
    """One sequence's tokens and, for every n-gram of ``key_length`` tokens, the positions
    where it ends (in order); grown token by token (``sync``)."""

    def __init__(self, key_length: int):
        self.key_length = key_length
        self._clear()

    def _clear(self) -> None:
        self.tokens: list[int] = []
        self._ends: dict[object, list[int]] = {}
        self._follower: dict[int, int] = {}  # token -> the token after its latest occurrence

    def sync(self, history: Sequence[int]) -> None:
        """Index what ``history`` adds; a history that is not a continuation of the
        indexed one (a new sequence) starts the index again."""
        known = len(self.tokens)
        if known > len(history) or (known and history[known - 1] != self.tokens[-1]):
            self._clear()
            known = 0
        for token in history[known:]:
            self._append(token)

    def _append(self, token: int) -> None:
        if self.tokens:
            self._follower[self.tokens[-1]] = token
        self.tokens.append(token)
        end = len(self.tokens) - 1
        if end + 1 >= self.key_length:
            self._ends.setdefault(self._key(end), []).append(end)

    def _key(self, end: int) -> object:
        if self.key_length == 1:
            return self.tokens[end]
        return tuple(self.tokens[end - self.key_length + 1 : end + 1])

    def earlier_ends(self, oldest_first: bool = False) -> list[int]:
        """Where the sequence's last ``key_length`` tokens occurred before (end positions),
        at most ``MAX_SCAN`` of them, most recent first (or oldest first)."""
        earlier = self.all_earlier_ends(oldest_first=True)
        return earlier[:MAX_SCAN] if oldest_first else earlier[-MAX_SCAN:][::-1]

    def all_earlier_ends(self, oldest_first: bool = False) -> list[int]:
        """Every earlier occurrence (``earlier_ends`` without its cap): what an engine's
        own rule scans."""
        last = len(self.tokens) - 1
        if last + 1 < self.key_length:
            return []
        ends = self._ends.get(self._key(last), [])
        earlier = ends[:-1] if ends and ends[-1] == last else ends
        return list(earlier) if oldest_first else earlier[::-1]

    def match_length(self, end: int, cap: int) -> int:
        """How many tokens ending at ``end`` equal the sequence's last ones, up to ``cap``
        (``end`` comes from ``earlier_ends``: at least ``key_length`` do)."""
        tokens, last = self.tokens, len(self.tokens) - 1
        length = self.key_length
        while length < cap and end - length >= 0 and tokens[end - length] == tokens[last - length]:
            length += 1
        return length

    def continuation(self, end: int, length: int) -> Path:
        """The ``length`` tokens that followed position ``end``. Where they run past the
        end of the sequence the copy goes on from its own start: a span that repeats
        drafts its next period."""
        out = self.tokens[end + 1 : end + 1 + length]
        period = len(self.tokens) - end - 1
        while len(out) < length:
            out.append(out[len(out) - period])
        return tuple(out)

    def follower(self, token: int) -> int | None:
        return self._follower.get(token)


@dataclass
class Candidates:
    """Continuations to merge into a tree, best first, each with its weight; at most
    ``budget`` tree nodes, none carrying less than ``min_share`` of the total weight."""

    paths: list[tuple[Path, float]] = field(default_factory=list)
    budget: int = 0
    min_share: float = 0.0


class Policy(Protocol):
    """How candidates are chosen from the index (a drafter's settings)."""

    @property
    def min_match(self) -> int: ...

    @property
    def max_tree_tokens(self) -> int: ...

    # proposes a guessed token where nothing matches (the engines' own rules do not)
    guesses: ClassVar[bool]

    def candidates_for(self, index: TokenIndex, depth: int) -> Candidates: ...


def merge(found: Candidates) -> Draft | None:
    """The trie of the candidate paths, cut to its ``budget`` heaviest nodes. A node
    weighs what the paths through it weigh; ties go to the better-ranked path, then to
    the shallower node. A parent weighs at least what its child does and ranks no worse,
    so it always comes first: the kept nodes form a tree, in parents-first order."""
    token: list[int] = [ROOT]
    parent: list[int] = [ROOT]
    weight: list[float] = [0.0]
    rank: list[int] = [0]
    depth: list[int] = [0]
    children: list[dict[int, int]] = [{}]
    for path_rank, (path, path_weight) in enumerate(found.paths):
        node = 0
        for step, tok in enumerate(path, 1):
            child = children[node].get(tok)
            if child is None:
                child = len(token)
                children[node][tok] = child
                children.append({})
                token.append(tok)
                parent.append(node)
                weight.append(0.0)
                rank.append(path_rank)
                depth.append(step)
            weight[child] += path_weight
            node = child
    total = sum(w for _, w in found.paths)
    nodes = [i for i in range(1, len(token)) if weight[i] >= found.min_share * total]
    kept = sorted(nodes, key=lambda i: (-weight[i], rank[i], depth[i]))[: found.budget]
    if not kept:
        return None
    position = {node: i for i, node in enumerate(kept)}
    parents = tuple(ROOT if parent[n] == 0 else position[parent[n]] for n in kept)
    return Draft([token[n] for n in kept], tree=TreeShape(parents))


@dataclass(frozen=True)
class LookupConfig:
    """Prompt lookup widened to a tree. The last ``max_match`` .. ``min_match`` tokens are
    matched against earlier text; occurrences rank by match length, then by recency
    (``prefer="recent"``) or age (``"first"``: transformers and vLLM take the earliest).
    The best ``candidates`` distinct continuations are merged into a tree: the best one
    ``draft_tokens`` deep, the others ``branch_tokens`` deep, ``max_tree_tokens`` nodes
    at most."""

    min_match: int
    max_match: int
    draft_tokens: int
    candidates: int
    branch_tokens: int
    max_tree_tokens: int
    prefer: Literal["recent", "first"]

    guesses: ClassVar[bool] = True

    def __post_init__(self):
        check_match(self.min_match, self.max_match)
        if min(self.draft_tokens, self.candidates, self.branch_tokens, self.max_tree_tokens) < 1:
            raise ValueError("draft_tokens, candidates, branch_tokens and max_tree_tokens are >= 1")
        if self.prefer not in ("recent", "first"):
            raise ValueError("prefer is 'recent' or 'first'")

    def candidates_for(self, index: TokenIndex, depth: int) -> Candidates:
        ends = index.earlier_ends(oldest_first=self.prefer == "first")
        ranked = sorted(
            range(len(ends)), key=lambda k: (-index.match_length(ends[k], self.max_match), k)
        )
        paths: list[Path] = []
        for k in ranked:
            length = min(self.branch_tokens if paths else self.draft_tokens, depth)
            path = index.continuation(ends[k], length)
            if not any(kept[: len(path)] == path for kept in paths):
                paths.append(path)
                if len(paths) == self.candidates:
                    break
        return Candidates([(p, 1.0) for p in paths], self.max_tree_tokens)


def check_match(min_match: int, max_match: int) -> None:
    if not 1 <= min_match <= max_match:
        raise ValueError(f"need 1 <= min_match ({min_match}) <= max_match ({max_match})")


class NgramDrafter(Drafter):
    """Drafts by lookup in the sequence itself (``policy``: ``LookupConfig`` or
    ``suffix.SuffixConfig``). With no earlier occurrence it proposes one cheap guess:
    the token that followed the last token's latest occurrence, else that token again."""

    def __init__(self, policy: Policy):
        self.policy = policy
        self.max_draft_tokens = policy.max_tree_tokens
        self.may_skip = not policy.guesses
        self.index = TokenIndex(policy.min_match)

    def reset(self) -> None:
        self.index = TokenIndex(self.policy.min_match)

    def propose(self, context: DraftContext) -> Draft:
        return self.draft_for(context.history or [context.last_token], context.max_tokens)

    def draft_for(self, history: Sequence[int], max_tokens: int) -> Draft:
        """The draft after ``history`` (ending with the root) when the decoder may still
        emit ``max_tokens`` tokens, the bonus included: what ``propose`` returns, and what
        the tuner replays."""
        self.index.sync(history)
        depth = max(1, min(max_tokens - 1, self.max_draft_tokens))
        found = self.policy.candidates_for(self.index, depth)
        found.budget = min(found.budget, self.max_draft_tokens)
        draft = merge(found)
        if draft is not None:
            return draft
        if not self.policy.guesses:
            return Draft([])  # a plain step: the root alone is verified
        last = history[-1]
        guess = self.index.follower(last)
        return Draft([last if guess is None else guess])
