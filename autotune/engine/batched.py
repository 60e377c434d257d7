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
from autotune.engine.runner import ExtraRows, Runner
from autotune.engine.sampling import GREEDY
from autotune.engine.segment import Segment


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


@dataclass
class _Batch:
    """One ``decode_batch`` call: what it was asked, and what its requests have done."""

    runner: Runner
    prompts: list[list[int]]
    max_new_tokens: int
    concurrency: int
    new_drafter: Callable[[], Drafter] | None
    prefills: Prefills | None
    on_done: Callable[[], None] | None = None  # told each time a request ends
    waiting: list[int] = field(init=False)  # prompt indices, the next one last
    results: list[DecodeResult | None] = field(init=False)
    latencies: list[float] = field(init=False)
    # heads that share the target's lm_head (Medusa) ask for the same rows in every request
    extra_rows: ExtraRows | None = None
    forwards: int = 0
    prefill_seconds: float = 0.0
    prefilled: int = 0

    def __post_init__(self) -> None:
        self.waiting = list(range(len(self.prompts)))[::-1]
        self.results = [None] * len(self.prompts)
        self.latencies = [0.0] * len(self.prompts)


def decode_batch(
    runner: Runner,
    prompts: list[list[int]],
    max_new_tokens: int,
    concurrency: int,
    new_drafter: Callable[[], Drafter] | None = None,
    prefills: Prefills | None = None,
    on_done: Callable[[], None] | None = None,
) -> BatchRun:
    """Greedy-decode every prompt with at most ``concurrency`` in flight; ``new_drafter``
    makes each request's drafter (None: plain greedy, one token a sequence a forward);
    ``prefills``: prompts prefilled before are copied from there, new ones kept there;
    ``on_done()`` is called as each request ends (a progress bar's advance)."""
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    generator = torch.Generator()
    batch = _Batch(runner, prompts, max_new_tokens, concurrency, new_drafter, prefills, on_done)
    running: list[_Request] = []
    start = time.perf_counter()
    while batch.waiting or running:
        admitted = _admit(batch, len(running))
        if admitted:
            began = time.perf_counter()
            batch.prefilled += _prefill(runner, admitted, batch.extra_rows, prefills)
            batch.prefill_seconds += time.perf_counter() - began
            running += _finish(batch, admitted)
        if running:
            running = _finish(batch, _step(batch, running, generator))
    seconds = time.perf_counter() - start
    done = [r for r in batch.results if r is not None]
    return BatchRun(
        done,
        batch.latencies,
        seconds,
        batch.forwards,
        concurrency,
        batch.prefill_seconds,
        batch.prefilled,
    )


def _admit(batch: _Batch, in_flight: int) -> list[_Request]:
    """The waiting requests that fit beside the ``in_flight`` ones, each with its cache
    and its drafter (reset)."""
    admitted: list[_Request] = []
    while batch.waiting and in_flight + len(admitted) < batch.concurrency:
        index = batch.waiting.pop()
        drafter = batch.new_drafter() if batch.new_drafter is not None else None
        if drafter is not None:
            drafter.reset()
            if batch.extra_rows is None:
                batch.extra_rows = drafter.extra_rows(batch.runner)
        prompt = batch.prompts[index]
        capacity = cache_capacity(prompt, batch.max_new_tokens)
        cache = batch.runner.new_cache(capacity=capacity)
        admitted.append(_Request(index, prompt, cache, time.perf_counter(), drafter))
    return admitted


def _finish(batch: _Batch, requests: list[_Request]) -> list[_Request]:
    """The requests still decoding; the others' results and latencies kept in ``batch``."""
    now, still = time.perf_counter(), []
    limit, eos = batch.max_new_tokens, batch.runner.eos_token_ids
    for request in requests:
        if request.ended or _finished(request.result.tokens, limit, eos):
            request.result.tokens = _truncate(request.result.tokens, limit, eos)
            batch.results[request.index] = request.result
            batch.latencies[request.index] = now - request.admitted
            if batch.on_done is not None:
                batch.on_done()
        else:
            still.append(request)
    return still


def _step(batch: _Batch, running: list[_Request], generator) -> list[_Request]:
    """One decoding forward over every running request: each drafts, the target verifies
    all the drafts at once, each keeps what it accepted. Returns ``running``."""
    runner = batch.runner
    drafts = _propose_all(runner, running, batch.max_new_tokens, generator)
    segments = []
    for request, draft in zip(running, drafts):
        committed = len(request.prompt) + len(request.result.tokens) - 1
        request.cache.crop(committed)
        segments.append(
            verify_segment(runner, request.cache, committed, request.result.tokens[-1], draft)
        )
    outputs = runner.forward_batch(segments, extra_rows=batch.extra_rows)
    batch.forwards += 1
    for request, draft, out in zip(running, drafts, outputs):
        _commit(request, draft, out, runner.eos_token_ids)
    return running


def _prefill(
    runner: Runner,
    admitted: list[_Request],
    extra_rows,
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
        request.cache.take(kept.cache)
        request.result.tokens.append(kept.first_token)
        request.hidden, request.committed_tokens = kept.hidden, list(request.prompt)
    if not fresh:
        return 0
    segments = [
        Segment(
            torch.tensor(r.prompt, device=runner.input_device),
            torch.arange(len(r.prompt), device=runner.input_device),
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
