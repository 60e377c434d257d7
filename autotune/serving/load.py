"""Rounds of concurrent requests to a serving engine (``measure.load.RunRound``): each
round's prompts sent by as many client threads as requests in flight, each thread taking
the next prompt when its request returns, as a server's users do."""

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

        def one(index: int) -> None:
            started = time.perf_counter()
            results[index] = DecodeResult(tokens=decode(batch[index], max_new_tokens).tokens)
            latencies[index] = time.perf_counter() - started

        start = time.perf_counter()
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            list(pool.map(one, range(len(batch))))
        return BatchRun(results, latencies, time.perf_counter() - start, 0, concurrency)

    return run
