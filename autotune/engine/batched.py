"""Decoding several requests at once, as a server does: plain and speculative greedy.

``concurrency`` requests are in flight; when one finishes the next prompt is admitted,
and its prefill shares the forward of the others' decoding steps (as servers do with
chunked prefill). Each forward runs every in-flight sequence's tokens through the weight
products once (``Runner.forward_batch``); attention stays per sequence, over its own
cache. With a drafter, each sequence has its own (its own state, its own draft, chain
or tree), and all the drafts are verified in that one forward.

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
    verify_segment,
)
from autotune.engine.kvcache import KVCache
from autotune.engine.proposal import Draft, DraftContext, Drafter, VerifyResult
from autotune.engine.runner import Runner, Segment
from autotune.engine.sampling import GREEDY


@dataclass
class BatchRun:
    """What one batched decoding of a list of prompts did."""

    results: list[DecodeResult]  # one per prompt, in the prompts' order
    latencies: list[float]  # seconds from each request's admission to its last token
    seconds: float  # the whole run, first admission to last token
    forwards: int  # target forwards, each over every sequence in flight
    concurrency: int

    @property
    def tokens(self) -> int:
        return sum(len(result.tokens) for result in self.results)

    @property
    def throughput(self) -> float:
        """Output tokens per second over all requests."""
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


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
) -> BatchRun:
    """Greedy-decode every prompt with at most ``concurrency`` in flight; ``new_drafter``
    makes each request's drafter (None: plain greedy, one token a sequence a forward)."""
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
    forwards = 0
    start = time.perf_counter()
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
            cache = runner.new_cache(capacity=len(prompt) + max_new_tokens + 64)
            admitted.append(_Request(index, prompt, cache, time.perf_counter(), drafter))
        segments, drafts = [], []
        for request in running:
            draft = _propose(runner, request, max_new_tokens, generator)
            drafts.append(draft)
            committed = len(request.prompt) + len(request.result.tokens) - 1
            request.cache.crop(committed)
            segments.append(
                verify_segment(runner, request.cache, committed, request.result.tokens[-1], draft)
            )
        for request in admitted:
            positions = torch.arange(len(request.prompt), device=runner.device)
            ids = torch.tensor(request.prompt, device=runner.device)
            segments.append(Segment(ids, positions, request.cache, last_only=True))
        outputs = runner.forward_batch(segments, extra_rows=extra_rows)
        forwards += 1
        for request, draft, out in zip(running, drafts, outputs):
            _commit(request, draft, out, eos)
        for request, out in zip(admitted, outputs[len(running) :]):
            request.result.tokens.append(int(out.logits[-1].argmax()))
            request.hidden, request.committed_tokens = out.hidden, list(request.prompt)
            request.extra = _extra_at(out, 0, 1)
        now = time.perf_counter()
        still = []
        for request in running + admitted:
            if request.ended or _finished(request.result.tokens, max_new_tokens, eos):
                request.result.tokens = _truncate(request.result.tokens, max_new_tokens, eos)
                results[request.index] = request.result
                latencies[request.index] = now - request.admitted
            else:
                still.append(request)
        running = still
    seconds = time.perf_counter() - start
    done = [r for r in results if r is not None]
    return BatchRun(done, latencies, seconds, forwards, concurrency)


def _propose(runner: Runner, request: _Request, max_new_tokens: int, generator):
    """This request's draft for the coming forward: an empty one for plain decoding."""
    tokens = request.result.tokens
    if request.drafter is None:
        return Draft(tokens=[])
    committed = len(request.prompt) + len(tokens) - 1
    return request.drafter.propose(
        DraftContext(
            runner,
            request.cache,
            tokens[-1],
            committed,
            max_new_tokens - len(tokens),
            GREEDY,
            generator,
            request.hidden,
            request.extra,
            request.committed_tokens,
            [*request.prompt, *tokens],
        )
    )


def _commit(request: _Request, draft, out, eos: frozenset[int]) -> None:
    """Keep what the target accepted of this request's draft, and its bonus token."""
    tokens = request.result.tokens
    committed = len(request.prompt) + len(tokens) - 1
    path, bonus, hidden, _, extra = accept(out, request.cache, committed, draft, GREEDY, None, None)
    accepted = [draft.tokens[node] for node in path]
    request.committed_tokens = [tokens[-1], *accepted]
    request.hidden, request.extra = hidden, extra
    tokens.extend([*accepted, bonus])
    request.ended = not eos.isdisjoint([*accepted, bonus])
    result = request.result
    result.steps += 1
    if request.drafter is not None:
        request.drafter.observe(VerifyResult(len(draft.tokens), len(path), tuple(path)))
        result.drafted += len(draft.tokens)
        result.accepted += len(path)
        result.draft_lengths.append(len(draft.tokens))
