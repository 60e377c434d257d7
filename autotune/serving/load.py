"""Rounds of concurrent requests to a serving engine (``measure.load.RunRound``): each
round's prompts sent by as many client threads as requests in flight, each thread taking
the next prompt when its request returns, as a server's users do. Decoding time is the
server's own per-request timing of its generated tokens (prompt processing apart), as
autotune's engine times prefills apart (``engine.batched``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

from autotune.engine.batched import BatchRun
from autotune.engine.decoding import DecodeResult
from autotune.measure.load import RunRound
from autotune.serving import Decoded

Decode = Callable[[Sequence[int], int], Decoded]


def concurrent_rounds(decoders: Mapping[str, Decode], max_new_tokens: int) -> RunRound:
    """Rounds decoded by each named decoder (a server's ``decode``), ``concurrency``
    requests at a time; wall-clock seconds from the first request to the last reply."""

    def run(name: str, batch: list[list[int]], concurrency: int) -> BatchRun:
        decode = decoders[name]
        results: list[DecodeResult] = [DecodeResult(tokens=[]) for _ in batch]
        latencies = [0.0] * len(batch)
        decoding = [0.0] * len(batch)

        def one(index: int) -> None:
            started = time.perf_counter()
            decoded = decode(batch[index], max_new_tokens)
            results[index] = DecodeResult(tokens=decoded.tokens)
            latencies[index] = time.perf_counter() - started
            decoding[index] = decoded.seconds

        start = time.perf_counter()
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            list(pool.map(one, range(len(batch))))
        seconds = time.perf_counter() - start
        # the server times each request's decoding (its prompt apart); with ``concurrency``
        # decoding side by side, their sum over that many is the round's decoding time
        prefill = min(max(seconds - sum(decoding) / concurrency, 0.0), seconds)
        return BatchRun(results, latencies, seconds, 0, concurrency, prefill)

    return run
