"""Plain greedy decoding in autotune's engine (``autotune.engine.decoding.decode_plain``)
beside transformers' ``generate`` over a static cache with its decoding step compiled
(CUDA graphs), on the same MT-bench prompts, interleaved prompt by prompt in one process:
tokens/s of each, their ratio and its 95% interval over prompts (paired bootstrap,
``autotune.measure.stats``); then, where the engine runs its fixed-shape step, a decode
step's time beside the step replayed alone (``around_the_step``), and the longest
prompt's prefill in parts of the step beside one eager call (``prefill_both_ways``).

    python benchmarks/gpu/greedy_vs_hf.py --model-path FILE.gguf --device cuda \
        [--prompts 8] [--max-new-tokens 128] [--out FILE]

transformers gets one ``StaticCache`` long enough for every prompt, reset between them, so
its decoding step is compiled and captured once (``generate`` compiles it by itself on a
GPU when the cache is static; a cache of each prompt's own length would compile it again
for every length). On a CPU, or with --no-compile, it decodes eagerly, and says so. Both
stop at the model's end-of-sequence tokens or after --max-new-tokens; each time includes
the prompt's prefill. Run with autotune and benchmarks/ importable (the GPU check sets
PYTHONPATH to both).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import torch
from hf_graph_reference import cache_keyword  # in benchmarks/, on PYTHONPATH

from autotune.engine import buckets, layers
from autotune.engine.decoding import decode_plain
from autotune.engine.runner import Runner
from autotune.errors import AutotuneError, exit_status
from autotune.files import write_atomic
from autotune.measure.stats import Pairs, bootstrap_interval
from autotune.models import load_target
from autotune.prompts import default_prompts_path, load_prompts

T = TypeVar("T")


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(device: torch.device, call: Callable[[], T]) -> tuple[float, T]:
    """``call()``'s wall-clock seconds, the device synchronised before and after (its
    queued work counted, none before it), and what it returned."""
    synchronize(device)
    start = time.perf_counter()
    out = call()
    synchronize(device)
    return time.perf_counter() - start, out


def engine_decoder(runner: Runner, max_new_tokens: int):
    """ids -> (seconds, tokens) of plain greedy decoding in autotune's engine."""

    def decode(ids: list[int]) -> tuple[float, list[int]]:
        return timed(runner.device, lambda: decode_plain(runner, ids, max_new_tokens).tokens)

    return decode


def transformers_decoder(model, eos: list[int], capacity: int, max_new_tokens: int, compile_: bool):
    """ids -> (seconds, tokens) of ``generate``'s greedy decoding over one static cache of
    ``capacity`` tokens, reset before each prompt."""
    from transformers import StaticCache

    cache = StaticCache(config=model.config, max_cache_len=capacity)
    device = next(model.parameters()).device
    options = {
        cache_keyword(model): cache,
        "do_sample": False,
        "max_new_tokens": max_new_tokens,
        "eos_token_id": eos,
        "pad_token_id": eos[0] if eos else 0,
        "disable_compile": not compile_,
    }

    def decode(ids: list[int]) -> tuple[float, list[int]]:
        cache.reset()
        prompt = torch.tensor([ids], device=device)
        mask = torch.ones_like(prompt)
        seconds, out = timed(device, lambda: model.generate(prompt, attention_mask=mask, **options))
        return seconds, out[0, len(ids) :].tolist()

    return decode


def around_the_step(runner: Runner, ids: list[int], steps: int = 64, replays: int = 200) -> dict:
    """What a decode step costs besides its recorded run: a decode step's time (plain
    greedy decoding, its prefill taken out) against the one-token step replayed alone.
    The difference is what a token costs around the replay: the feed's few operations
    (its argmax made the next run's input on the device, ``StaticStep.decode_fed``) and
    whatever of the host's queueing and reading the runs queued ahead do not hide. Empty
    where the runner has no fixed-shape step (a CPU, by default)."""
    step = runner.static
    if step is None:
        return {}

    def decoding(max_new_tokens: int) -> tuple[float, int]:
        seconds, result = timed(runner.device, lambda: decode_plain(runner, ids, max_new_tokens))
        return seconds, result.steps

    decoding(steps)  # warm-up: the prompt's bucket and the one-token step recorded
    (short_s, short), (long_s, long) = decoding(1), decoding(steps)
    if long - short < 8:
        return {}  # it met its end-of-sequence token at once
    replay_us = replayed_us(runner, replays)
    if replay_us is None:
        return {}
    decode_us = (long_s - short_s) / (long - short) * 1e6
    return {
        "decode_step_us": round(decode_us, 1),
        "step_replay_us": round(replay_us, 1),
        "around_step_us": round(decode_us - replay_us, 1),
    }


def replayed_us(runner: Runner, replays: int) -> float | None:
    """us of one replay of the runner's one-token step alone, over the last call's inputs
    (it rewrites one column); None where the step cannot be recorded."""
    step = runner.static
    run = None if step is None else step.run_for(1, 1, step.variant())
    if run is None:
        return None

    def replayed() -> None:
        for _ in range(replays):
            run()

    return timed(runner.device, replayed)[0] / replays * 1e6


@torch.inference_mode()  # as the decodings run
def replays_by_form(runner: Runner, ids: list[int], replays: int = 200) -> dict:
    """The one-token step replayed alone with each of the layers' fused forms
    (``layers.FUSION_RULES``) turned off in turn, by a runner of its own over the same
    model: beside ``step_replay_us`` (every form on), whether each form pays for this
    model on this device (each was chosen by counting a step's operations on a CPU).
    Empty where the runner has no fixed-shape step."""
    if runner.static is None:
        return {}
    out = {}
    for rule in layers.FUSION_RULES:
        with layers.forms_answered({rule: lambda x: False}):  # recorded in the plain form
            plain = Runner(runner.model, static=True)
            decode_plain(plain, ids, 2)
            us = replayed_us(plain, replays)
        if us is not None:
            out[f"step_replay_us_{plain_form(rule)}"] = round(us, 1)
    return out


def plain_form(rule: str) -> str:
    """``fused_norm_applies`` -> ``plain_norm``: the form a step takes with the rule off."""
    return "plain_" + rule.removeprefix("fused_").removesuffix("_applies")


def prefill_both_ways(runner: Runner, ids: list[int], repeats: int = 5) -> dict:
    """A prompt longer than the largest bucket prefilled in parts of the recorded step and
    in one eager call (``StaticStep.parts_pay`` decides which a run takes): the better
    of ``repeats`` each, in ms. Empty without a step or such a prompt."""
    step = runner.static
    if step is None or len(ids) <= buckets.LARGEST:
        return {}
    chosen, found = step.parts_pay, {}
    tokens = torch.tensor(ids, device=runner.input_device)
    positions = torch.arange(len(ids), device=runner.input_device)
    for parts in (True, False):
        step.parts_pay = parts
        seconds = []
        for _ in range(repeats + 1):  # the first records the parts' steps
            cache = runner.new_cache(len(ids) + 64)
            prefill = functools.partial(runner.forward, tokens, positions, cache, last_only=True)
            seconds.append(timed(runner.device, prefill)[0])
            del cache
        found["prefill_parts_ms" if parts else "prefill_eager_ms"] = round(
            min(seconds[1:]) * 1e3, 3
        )
    step.parts_pay = chosen
    return {"prefill_tokens": len(ids), **found, "prefill_in_parts": chosen}


def summary(rows: list[tuple[float, int, float, int]], same: int) -> dict:
    """The engine against transformers over the prompts decoded so far."""
    pairs = Pairs.of(rows)
    interval = bootstrap_interval(pairs)
    return {
        "prompts": len(rows),
        "engine_tokens_per_s": round(
            float(pairs.method_tokens.sum() / pairs.method_seconds.sum()), 2
        ),
        "transformers_tokens_per_s": round(
            float(pairs.baseline_tokens.sum() / pairs.baseline_seconds.sum()), 2
        ),
        "engine_over_transformers": round(float(pairs.speedup()), 4),
        "interval": interval.as_list(),
        "same_tokens": same,
    }


def interleaved(engine, transformers, encoded: list[list[int]], until: float, write) -> dict:
    """Each prompt decoded by both, the order alternating, while time is left (two
    prompts at the least); ``write(summary)`` after each."""
    rows: list[tuple[float, int, float, int]] = []
    same = 0
    result: dict = {}
    for index, ids in enumerate(encoded):
        if len(rows) >= 2 and time.monotonic() > until:
            break
        order = (engine, transformers) if index % 2 == 0 else (transformers, engine)
        timed = {decoder: decoder(ids) for decoder in order}
        (e_s, e_tokens), (t_s, t_tokens) = timed[engine], timed[transformers]
        same += e_tokens == t_tokens
        rows.append((e_s, len(e_tokens), t_s, len(t_tokens)))
        result = summary(rows, same)
        write(result)
    return result


def measure(args: argparse.Namespace, write) -> dict:
    started = time.monotonic()
    target = load_target(args.model, args.model_path, args.dtype, args.device)
    runner = Runner(target.model)
    device = runner.device
    prompts = load_prompts(default_prompts_path())[: args.prompts]
    encoded = [target.encode_chat(p.text) for p in prompts]
    capacity = max(len(ids) for ids in encoded) + args.max_new_tokens + 8
    compiled = device.type == "cuda" and not args.no_compile
    eos = sorted(runner.eos_token_ids)
    engine = engine_decoder(runner, args.max_new_tokens)
    transformers = transformers_decoder(target.model, eos, capacity, args.max_new_tokens, compiled)
    head = {
        "model": target.name,
        "dtype": target.dtype,
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "max_new_tokens": args.max_new_tokens,
        "compiled": compiled,
        "transformers": "generate, StaticCache, "
        + ("compiled (reduce-overhead: CUDA graphs)" if compiled else "eager"),
    }
    with torch.inference_mode():
        engine(encoded[0])  # warm-up: allocations, kernel choices
        transformers(encoded[0])  # warm-up: compiling and capturing the decoding step
        transformers(encoded[0])
        warmed = time.monotonic() - started
        until = started + args.time_limit
        result = interleaved(engine, transformers, encoded, until, lambda r: write({**head, **r}))
        around = around_the_step(runner, encoded[0], steps=min(64, args.max_new_tokens))
        around |= prefill_both_ways(runner, max(encoded, key=len))
        around |= replays_by_form(runner, encoded[0])
    return {**head, **result, **around, "setup_s": round(warmed, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--model-path", help="the model's GGUF file or folder")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--prompts", type=int, default=8, help="MT-bench prompts, first N")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument(
        "--time-limit",
        type=float,
        default=float("inf"),
        metavar="SECONDS",
        help="start no new prompt after this long (two at the least)",
    )
    parser.add_argument("--no-compile", action="store_true", help="transformers decodes eagerly")
    parser.add_argument("--out", type=Path, help="also write the JSON here, after every prompt")
    args = parser.parse_args(argv)

    def write(result: dict) -> None:
        if args.out is not None:
            write_atomic(args.out, json.dumps(result, indent=1) + "\n")

    if args.prompts < 2:
        raise AutotuneError("--prompts: give 2 or more (an interval needs a spread)")
    result = measure(args, write)
    write(result)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(exit_status(main))
