"""Decoding several requests at once, as a server does: plain and speculative greedy.

``concurrency`` requests are in flight; when one finishes the next prompt is admitted.
Each decoding forward runs every in-flight sequence's tokens through the weight products
once (``Runner.forward_batch``); attention stays per sequence, over its own cache. With a
drafter, each sequence has its own (its own state, its own draft, chain or tree), and all
the drafts are verified in that one forward. New requests' prompts are prefilled in a
forward of their own, timed apart (``BatchRun.prefill_seconds``): a prefill costs the
same with and without speculation, and long prompts (Spec-Bench's summaries: 800
tokens, about 1.2 s on 2 cores, against 17 ms for a step of 8 sequences) would otherwise
dilute every ratio towards 1.

Greedy only: each sequence's output equals its own plain greedy output, token for token.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from autotune.engine.decoding import (
    DecodeResult,
    _extra_at,
    _finished,
    _truncate,
    accept,
    cache_capacity,
    record_step,
    verify_segment,
)
from autotune.engine.kvcache import KVCache
from autotune.engine.proposal import Draft, DraftContext, Drafter
from autotune.engine.runner import Runner, Segment
from autotune.engine.sampling import GREEDY


@dataclass
class BatchRun:
    """What one batched decoding of a list of prompts did."""

    results: list[DecodeResult]  # one per prompt, in the prompts' order
    latencies: list[float]  # seconds from each request's admission to its last token
    seconds: float  # the whole run, first admission to last token
    forwards: int  # decoding forwards, each over every sequence in flight
    concurrency: int
    prefill_seconds: float = 0.0  # of ``seconds``: the prompts' prefills
    prefilled: int = 0  # prompts prefilled afresh (the others copied from ``Prefills``)

    @property
    def tokens(self) -> int:
        return sum(len(result.tokens) for result in self.results)

    @property
    def decode_seconds(self) -> float:
        """The run less its prefills: what speculation can shorten."""
        return self.seconds - self.prefill_seconds

    @property
    def throughput(self) -> float:
        """Output tokens per second of decoding over all requests (prefills apart)."""
        return self.tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0


@dataclass
class _Prefilled:
    cache: KVCache
    first_token: int
    hidden: torch.Tensor | None


class Prefills:
    """Prefilled prompts kept for the next decodings of the same prompts (a load level
    decodes each round once plainly and once per setting): a copy of a prompt's cache
    costs far less than its prefill (800 tokens: 1.2 s on 2 cores). Kept up to
    ``max_bytes``; only for drafters that ask the prefill for no extra rows."""

    def __init__(self, max_bytes: int = 1 << 30):
        self.max_bytes = max_bytes
        self._kept: dict[tuple[int, ...], _Prefilled] = {}
        self._bytes = 0

    def clear(self) -> None:
        self._kept.clear()
        self._bytes = 0

    def get(self, prompt: list[int]) -> _Prefilled | None:
        return self._kept.get(tuple(prompt))

    def keep(self, prompt: list[int], request: _Request) -> None:
        size = request.cache.nbytes
        if self._bytes + size > self.max_bytes or tuple(prompt) in self._kept:
            return
        cache = request.cache.copy(request.cache.length(0))
        self._kept[tuple(prompt)] = _Prefilled(cache, request.result.tokens[0], request.hidden)
        self._bytes += size


@dataclass
class _Request:
    index: int
    prompt: list[int]
    cache: KVCache
    admitted: float
    drafter: Drafter | None = None
    result: DecodeResult = field(default_factory=lambda: DecodeResult(tokens=[]))
    hidden: torch.Tensor | None = None
    extra: torch.Tensor | None = None
    committed_tokens: list[int] = field(default_factory=list)
    ended: bool = False  # an end-of-sequence token was emitted


def decode_batch(
    runner: Runner,
    prompts: list[list[int]],
    max_new_tokens: int,
    concurrency: int,
    new_drafter: Callable[[], Drafter] | None = None,
    prefills: Prefills | None = None,
) -> BatchRun:
    """Greedy-decode every prompt with at most ``concurrency`` in flight; ``new_drafter``
    makes each request's drafter (None: plain greedy, one token a sequence a forward);
    ``prefills``: prompts prefilled before are copied from there, new ones kept there."""
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    generator = torch.Generator()
    eos = runner.eos_token_ids
    waiting = list(range(len(prompts)))[::-1]
    running: list[_Request] = []
    results: list[DecodeResult | None] = [None] * len(prompts)
    latencies = [0.0] * len(prompts)
    # heads that share the target's lm_head (Medusa) ask for the same rows in every request
    extra_rows = None
    forwards, prefill_seconds, prefilled = 0, 0.0, 0
    start = time.perf_counter()

    def finish(requests: list[_Request]) -> list[_Request]:
        now, still = time.perf_counter(), []
        for request in requests:
            if request.ended or _finished(request.result.tokens, max_new_tokens, eos):
                request.result.tokens = _truncate(request.result.tokens, max_new_tokens, eos)
                results[request.index] = request.result
                latencies[request.index] = now - request.admitted
            else:
                still.append(request)
        return still

    while waiting or running:
        admitted: list[_Request] = []
        while waiting and len(running) + len(admitted) < concurrency:
            index = waiting.pop()
            drafter = new_drafter() if new_drafter is not None else None
            if drafter is not None:
                drafter.reset()
                if extra_rows is None:
                    extra_rows = drafter.extra_rows(runner)
            prompt = prompts[index]
            cache = runner.new_cache(capacity=cache_capacity(prompt, max_new_tokens))
            admitted.append(_Request(index, prompt, cache, time.perf_counter(), drafter))
        if admitted:
            began = time.perf_counter()
            prefilled += _prefill(runner, admitted, extra_rows, max_new_tokens, prefills)
            prefill_seconds += time.perf_counter() - began
            running += finish(admitted)
        if not running:
            continue
        drafts = _propose_all(runner, running, max_new_tokens, generator)
        segments = []
        for request, draft in zip(running, drafts):
            committed = len(request.prompt) + len(request.result.tokens) - 1
            request.cache.crop(committed)
            segments.append(
                verify_segment(runner, request.cache, committed, request.result.tokens[-1], draft)
            )
        outputs = runner.forward_batch(segments, extra_rows=extra_rows)
        forwards += 1
        for request, draft, out in zip(running, drafts, outputs):
            _commit(request, draft, out, eos)
        running = finish(running)
    seconds = time.perf_counter() - start
    done = [r for r in results if r is not None]
    return BatchRun(done, latencies, seconds, forwards, concurrency, prefill_seconds, prefilled)


def _prefill(
    runner: Runner,
    admitted: list[_Request],
    extra_rows,
    max_new_tokens: int,
    prefills: Prefills | None,
) -> int:
    """The new requests' prompts in one forward of their own (or copied from
    ``prefills``): each gets its first token. Returns how many were prefilled afresh."""
    reuse = prefills if extra_rows is None else None
    fresh = []
    for request in admitted:
        kept = reuse.get(request.prompt) if reuse is not None else None
        if kept is None:
            fresh.append(request)
            continue
        request.cache = kept.cache.copy(cache_capacity(request.prompt, max_new_tokens))
        request.result.tokens.append(kept.first_token)
        request.hidden, request.committed_tokens = kept.hidden, list(request.prompt)
    if not fresh:
        return 0
    segments = [
        Segment(
            torch.tensor(r.prompt, device=runner.device),
            torch.arange(len(r.prompt), device=runner.device),
            r.cache,
            last_only=True,
        )
        for r in fresh
    ]
    for request, out in zip(fresh, runner.forward_batch(segments, extra_rows=extra_rows)):
        request.result.tokens.append(int(out.logits[-1].argmax()))
        request.hidden, request.committed_tokens = out.hidden, list(request.prompt)
        request.extra = _extra_at(out, 0, 1)
        if reuse is not None:
            reuse.keep(request.prompt, request)
    return len(fresh)


def _propose_all(
    runner: Runner, requests: list[_Request], max_new_tokens: int, generator
) -> list[Draft]:
    """Each request's draft for the coming forward (an empty one for plain decoding),
    drafters of one kind proposing together (``Drafter.propose_all``)."""
    drafts: list[Draft] = [Draft(tokens=[]) for _ in requests]
    kinds: dict[type[Drafter], list[int]] = {}
    for index, request in enumerate(requests):
        if request.drafter is not None:
            kinds.setdefault(type(request.drafter), []).append(index)
    for kind, indices in kinds.items():
        drafters = [d for i in indices if (d := requests[i].drafter) is not None]
        contexts = [_context(runner, requests[i], max_new_tokens, generator) for i in indices]
        for i, draft in zip(indices, kind.propose_all(drafters, contexts)):
            drafts[i] = draft
    return drafts


def _context(runner: Runner, request: _Request, max_new_tokens: int, generator) -> DraftContext:
    tokens = request.result.tokens
    return DraftContext(
        runner,
        request.cache,
        tokens[-1],
        len(request.prompt) + len(tokens) - 1,
        max_new_tokens - len(tokens),
        GREEDY,
        generator,
        request.hidden,
        request.extra,
        request.committed_tokens,
        [*request.prompt, *tokens],
    )


def _commit(request: _Request, draft, out, eos: frozenset[int]) -> None:
    """Keep what the target accepted of this request's draft, and its bonus token."""
    committed = len(request.prompt) + len(request.result.tokens) - 1
    path, bonus, hidden, _, extra = accept(out, request.cache, committed, draft, GREEDY, None, None)
    request.hidden, request.extra = hidden, extra
    request.committed_tokens, request.ended = record_step(
        request.result, request.drafter, draft, path, bonus, eos
    )
