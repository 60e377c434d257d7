"""Plain and speculative decoding on the runner.

Both stop after ``max_new_tokens`` or at an end-of-sequence token (kept in the output),
so that their outputs can be compared token for token.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from autotune.engine.proposal import DraftContext, Drafter, VerifyResult
from autotune.engine.runner import ExtraRows, Runner
from autotune.engine.sampling import GREEDY, SamplingConfig, probabilities, sample
from autotune.engine.segment import Segment
from autotune.engine.static_cache import StaticCache
from autotune.engine.tree import TreeShape
from autotune.engine.verify import (
    TypicalAcceptance,
    accept_greedy,
    accept_sampled,
    accept_tree_greedy,
    accept_tree_sampled,
    accept_tree_typical,
)


def tokens_per_step(tokens: int, steps: int, sequences: int = 1) -> float:
    """Tokens each target forward after the prefill yields, on average over ``sequences``
    decoded sequences of ``tokens`` tokens and ``steps`` forwards in all: the one
    definition everything reports. Each prefill's own token is not counted, so plain
    decoding scores exactly 1 and a drafter's figure is its accepted tokens plus the bonus
    per verification."""
    return (tokens - sequences) / steps if steps else 1.0


@dataclass
class DecodeResult:
    tokens: list[int]
    steps: int = 0  # target forward passes after prefill
    drafted: int = 0
    accepted: int = 0
    draft_lengths: list[int] = field(default_factory=list)

    @property
    def tokens_per_step(self) -> float:
        return tokens_per_step(len(self.tokens), self.steps)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


def _pick(logits: torch.Tensor, sampling: SamplingConfig, generator: torch.Generator) -> int:
    if sampling.greedy:
        return int(logits.argmax())
    return sample(probabilities(logits, sampling), generator)


def cache_capacity(prompt: list[int], max_new_tokens: int) -> int:
    """Room for the prompt, its answer and a draft beyond it (the cache grows past it)."""
    return len(prompt) + max_new_tokens + 64


def _prefill(
    runner: Runner, prompt: list[int], max_new_tokens: int, extra_rows: ExtraRows | None = None
):
    cache = runner.new_cache(capacity=cache_capacity(prompt, max_new_tokens))
    ids = torch.tensor(prompt, device=runner.input_device)
    out = runner.forward(
        ids,
        torch.arange(len(prompt), device=runner.input_device),
        cache,
        last_only=True,
        extra_rows=extra_rows,
    )
    return cache, out


def _extra_at(out, row: int, rows: int):
    """The extra logits [k, V] of one row, from k blocks of ``rows`` rows."""
    if out.extra_logits is None:
        return None
    return out.extra_logits.view(-1, rows, out.extra_logits.shape[-1])[:, row]


def _finished(tokens: list[int], max_new_tokens: int, eos: frozenset[int]) -> bool:
    return len(tokens) >= max_new_tokens or (bool(tokens) and tokens[-1] in eos)


def _truncate(tokens: list[int], max_new_tokens: int, eos: frozenset[int]) -> list[int]:
    for i, token in enumerate(tokens[:max_new_tokens]):
        if token in eos:
            return tokens[: i + 1]
    return tokens[:max_new_tokens]


def decode_plain(
    runner: Runner, prompt: list[int], max_new_tokens: int, sampling: SamplingConfig = GREEDY
) -> DecodeResult:
    """One target forward per token: the baseline every method is measured against."""
    generator = torch.Generator().manual_seed(sampling.seed)
    cache, out = _prefill(runner, prompt, max_new_tokens)
    tokens = [_pick(out.logits[-1], sampling, generator)]
    if sampling.greedy and (fed := _fed_greedy(runner, cache, prompt, tokens, max_new_tokens)):
        return DecodeResult(tokens=tokens + fed, steps=len(fed))
    steps = 0
    while not _finished(tokens, max_new_tokens, runner.eos_token_ids):
        position = len(prompt) + len(tokens) - 1
        out = runner.forward(
            torch.tensor([tokens[-1]], device=runner.input_device),
            torch.tensor([position], device=runner.input_device),
            cache,
        )
        tokens.append(_pick(out.logits[-1], sampling, generator))
        steps += 1
    return DecodeResult(tokens=tokens, steps=steps)


def _fed_greedy(
    runner: Runner, cache, prompt: list[int], tokens: list[int], max_new_tokens: int
) -> list[int] | None:
    """The rest of a greedy decoding in the runner's fixed-shape step, each token fed to
    the next step on the device (``StaticStep.decode_fed``: the same one-token step,
    the same tokens, without the host waiting for each); None where it cannot run (no
    step, a cache off it, nothing left to decode)."""
    eos = runner.eos_token_ids
    if runner.static is None or _finished(tokens, max_new_tokens, eos):
        return None
    if not isinstance(cache, StaticCache):
        return None
    position = len(prompt) + len(tokens) - 1
    count = max_new_tokens - len(tokens)
    return runner.static.decode_fed(cache, tokens[-1], position, count, eos.__contains__)


def decode_speculative(
    runner: Runner,
    drafter: Drafter,
    prompt: list[int],
    max_new_tokens: int,
    sampling: SamplingConfig = GREEDY,
    typical: TypicalAcceptance | None = None,
    on_verify=None,
) -> DecodeResult:
    """Draft, verify the whole draft (chain or tree) in one target forward, keep the
    accepted path and the target's bonus token. ``typical`` (sampling only) swaps exact
    speculative sampling for Medusa's typical acceptance. ``on_verify(draft, path,
    target_logits)`` is called after each verification, for statistics."""
    generator = torch.Generator().manual_seed(sampling.seed)
    drafter.reset()
    extra_rows = drafter.extra_rows(runner)
    cache, out = _prefill(runner, prompt, max_new_tokens, extra_rows)
    tokens = [_pick(out.logits[-1], sampling, generator)]
    hidden, extra, committed_tokens = out.hidden, _extra_at(out, 0, 1), list(prompt)
    result = DecodeResult(tokens=tokens)
    ended = False  # an end-of-sequence token was emitted (maybe inside an accepted path)
    while not ended and not _finished(tokens, max_new_tokens, runner.eos_token_ids):
        committed = len(prompt) + len(tokens) - 1  # the last token is not in the cache yet
        budget = max_new_tokens - len(tokens)
        draft = drafter.propose(
            DraftContext(
                runner,
                cache,
                tokens[-1],
                committed,
                budget,
                sampling,
                generator,
                hidden,
                extra,
                committed_tokens,
                [*prompt, *tokens],
            )
        )
        cache.crop(committed)
        path, bonus, hidden, logits, extra = _verify(
            runner, cache, committed, tokens[-1], draft, sampling, typical, generator, extra_rows
        )
        if on_verify is not None:
            on_verify(draft, path, logits)
        committed_tokens, ended = record_step(
            result, drafter, draft, path, bonus, runner.eos_token_ids
        )
    result.tokens = _truncate(tokens, max_new_tokens, runner.eos_token_ids)
    return result


def record_step(
    result: DecodeResult,
    drafter: Drafter | None,
    draft,
    path: list[int],
    bonus: int,
    eos: frozenset[int],
) -> tuple[list[int], bool]:
    """One verification into ``result``: the accepted path and the bonus token appended,
    the drafter (None: plain decoding) told how far its draft held. Returns the tokens it
    committed, root first, and whether an end-of-sequence token was among them."""
    tokens = result.tokens
    committed_tokens = [tokens[-1], *(draft.tokens[node] for node in path)]
    tokens.extend([*committed_tokens[1:], bonus])
    result.steps += 1
    if drafter is not None:
        drafter.observe(VerifyResult(len(draft.tokens), len(path), tuple(path)))
        result.drafted += len(draft.tokens)
        result.accepted += len(path)
        result.draft_lengths.append(len(draft.tokens))
    return committed_tokens, not eos.isdisjoint([*committed_tokens[1:], bonus])


def _verify(
    runner: Runner,
    cache,
    committed: int,
    last_token: int,
    draft,
    sampling,
    typical,
    generator,
    extra_rows=None,
):
    """One target forward over the root and the draft; the cache keeps the accepted path.
    Returns (accepted node indices, bonus token, hidden states of root + path)."""
    segment = verify_segment(runner, cache, committed, last_token, draft)
    out = runner.forward_batch([segment], extra_rows=extra_rows)[0]
    return accept(out, cache, committed, draft, sampling, typical, generator)


def verify_segment(runner: Runner, cache, committed: int, last_token: int, draft) -> Segment:
    """The root and the draft as one sequence's part of a verify forward: a chain at
    consecutive positions, a tree at its depths under its attention mask."""
    tree = draft.tree
    device = runner.input_device
    ids = torch.tensor([last_token, *draft.tokens], device=device)
    if tree is None or tree.is_chain:
        positions = torch.arange(committed, committed + len(ids), device=device)
        return Segment(ids, positions, cache)
    positions = committed + tree.position_offsets(device)
    return Segment(ids, positions, cache, mask=tree.attention_mask(device))


def accept(out, cache, committed: int, draft, sampling, typical, generator):
    """The accepted path and bonus token from the target's logits over the root and the
    draft (``verify_segment``); the cache keeps the root and the path. Returns (path,
    bonus, hidden states of root + path, logits, extra logits at the path's end)."""
    tree = draft.tree
    chain = tree is None or tree.is_chain
    if sampling.greedy:
        if chain:
            accepted, bonus = accept_greedy(draft.tokens, out.logits)
            path = list(range(accepted))
        else:
            path, bonus = accept_tree_greedy(draft.tokens, tree, out.logits)
    else:
        probs = probabilities(out.logits, sampling)
        shape = tree or TreeShape.chain(len(draft.tokens))
        if typical is not None:
            path, bonus = accept_tree_typical(draft.tokens, shape, probs, typical, generator)
        elif chain and draft.draft_probs is not None:
            accepted, bonus = accept_sampled(draft.tokens, draft.draft_probs, probs, generator)
            path = list(range(accepted))
        else:
            path, bonus = accept_tree_sampled(
                draft.tokens, shape, draft.draft_probs, probs, generator
            )
    rows = [0, *(node + 1 for node in path)]
    if rows == list(range(len(rows))):
        cache.crop(committed + len(rows))
    else:
        cache.keep(committed, torch.tensor(rows))
    return (
        path,
        bonus,
        out.hidden[rows],
        out.logits,
        _extra_at(out, rows[-1], len(draft.tokens) + 1),
    )
