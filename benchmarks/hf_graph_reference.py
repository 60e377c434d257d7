"""Transformers' own forward of a model over n new tokens after a context, the way serving
engines run it on a GPU: `torch.compile(mode="reduce-overhead")` (CUDA graphs) over a
`StaticCache`, beside the eager forward over a dynamic cache. The reference `autotune
latency` is held to on a GPU (issue 40: within 1.05x of the graph-captured forward of the
same shapes, timed in the same call).

    python benchmarks/hf_graph_reference.py --model vicuna-13b --random-weights \
        --dtype float16 --device cuda [--sizes 1,8,16,32,64] [--out FILE]

The shapes are `autotune latency`'s: batch 1, a 160-token context of random tokens, then
n new tokens, logits for all n. Each figure is the median of --repeats forwards after
warm-up, the device synchronised before the clock is read. The model is built as
`autotune latency --random-weights` builds it (``autotune.models.random_weights_model``), or
loaded as autotune loads it (an alias, folder or GGUF, with --model-path). On a CPU nothing
is compiled (CUDA graphs are a GPU's): the static cache's forward is timed eagerly, and the
output says so. Prints ms per forward as JSON; with --out also writes it there after every
size, so a run stopped at its time limit keeps what it measured.
"""

from __future__ import annotations

import argparse
import inspect
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from autotune.errors import AutotuneError, exit_status
from autotune.files import write_atomic
from autotune.measure.costs import CONTEXT_TOKENS

SIZES = (1, 8, 16, 32, 64)
WARMUP = 3  # compile, the graph's warm-up run, its capture


def build_model(args: argparse.Namespace):
    """(model, name): random weights of the architecture, or the weights autotune loads."""
    tokens = args.context + max(args.sizes)
    if args.random_weights:
        from autotune.models import random_weights_model

        if args.model_path:
            raise AutotuneError("--random-weights reads no weights: leave --model-path out")
        return random_weights_model(args.model, args.dtype, args.device, tokens)
    from autotune.models import load_target

    target = load_target(args.model, args.model_path, args.dtype, args.device, tokens)
    return target.model, target.name


def cache_keyword(model) -> str:
    """The forward's name for the KV cache: `cache` in newer transformers releases,
    `past_key_values` before (both 5.x)."""
    parameters = inspect.signature(model.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def step_arguments(model, cache, start: int, count: int, device) -> dict:
    """The keyword arguments of one forward over ``count`` tokens written from ``start``:
    token ids, positions, the cache (and its positions, where the release takes them)."""
    positions = torch.arange(start, start + count, device=device)
    arguments = {
        "input_ids": torch.ones(1, count, dtype=torch.long, device=device),
        "position_ids": positions[None],
        cache_keyword(model): cache,
        "use_cache": True,
    }
    if "cache_position" in inspect.signature(model.forward).parameters:
        arguments["cache_position"] = positions
    return arguments


def context_ids(model, context: int, device) -> torch.Tensor:
    # drawn on the CPU with a fixed seed, as autotune's curve draws its context
    generator = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    return torch.randint(0, vocab, (1, context), generator=generator).to(device)


def median_ms(call, repeats: int, device, prepare=None) -> float:
    """Median ms of ``call()``, ``prepare()`` run untimed before each and the device
    synchronised before the clock is read."""
    times = []
    for _ in range(repeats):
        if prepare is not None:
            prepare()
        _synchronize(device)
        start = time.perf_counter()
        call()
        _synchronize(device)
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def _synchronize(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def rewind(cache, context: int) -> None:
    """Back to the context alone, so the next forward writes the same slots: a negative
    count removes that many tokens in every 5.x release that can crop; a static cache of
    those that cannot is set back by its write position (5.17), or (4.x, which counts a
    layer's written slots) has the slots past the context cleared."""
    extra = int(cache.get_seq_length()) - context
    if extra <= 0:
        return
    try:
        cache.crop(-extra)
    except (AttributeError, NotImplementedError):
        for layer in cache.layers:
            if hasattr(layer, "cumulative_length"):
                layer.cumulative_length.fill_(context)
            else:
                layer.keys[..., context:, :].zero_()
                layer.values[..., context:, :].zero_()


def time_forward(model, forward, cache, context: int, n: int, repeats: int, before=None):
    """Median ms of ``forward`` over n tokens after the ``context`` tokens that ``cache``
    holds, rewound to them (untimed) before each; ``before`` runs inside the clock."""
    device = next(model.parameters()).device
    arguments = step_arguments(model, cache, context, n, device)

    def call() -> None:
        if before is not None:
            before()
        forward(**arguments)

    for _ in range(WARMUP):
        rewind(cache, context)
        call()
    return median_ms(call, repeats, device, prepare=lambda: rewind(cache, context))


def eager_dynamic(model, ids: torch.Tensor, sizes, repeats: int) -> dict[int, float]:
    """ms of one eager forward over n tokens after the context, over a dynamic cache."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    model(input_ids=ids, **{cache_keyword(model): cache}, use_cache=True)
    context = ids.shape[1]
    return {n: time_forward(model, model, cache, context, n, repeats) for n in sizes}


def static_forward(model, ids: torch.Tensor, room: int, compiled: bool):
    """(forward, cache): a StaticCache holding the context and room for ``room`` more
    tokens, and the forward over it, compiled with CUDA graphs when ``compiled`` (the
    options transformers' own generate compiles its decoding step with)."""
    from transformers import StaticCache

    context, device = ids.shape[1], ids.device
    cache = StaticCache(config=model.config, max_cache_len=context + room)
    arguments = step_arguments(model, cache, 0, context, device)
    arguments["input_ids"] = ids
    model(**arguments)
    if not compiled:
        return model, cache
    # what generate compiles (PreTrainedModel.get_compiled_call, its default CompileConfig)
    return torch.compile(model.__call__, mode="reduce-overhead", fullgraph=False), cache


def graph_sizes(model, ids, sizes, repeats: int, compiled: bool, until: float, done) -> None:
    """ms of one static-cache forward over n tokens, for each n while time is left;
    ``done(n, ms)`` after each, ``done(n, None)`` for a size left out."""
    forward, cache = static_forward(model, ids, max(sizes), compiled)
    # each call a new step: the graphs may then overwrite the last replay's outputs
    mark_step = getattr(torch.compiler, "cudagraph_mark_step_begin", None) if compiled else None
    for n in sizes:
        if time.monotonic() > until:
            done(n, None)
            continue
        done(n, time_forward(model, forward, cache, ids.shape[1], n, repeats, before=mark_step))
    return lambda n: disagreement(model, ids, forward, cache, n, mark_step)


def disagreement(model, ids: torch.Tensor, forward, cache, n: int, before=None) -> float:
    """||logits - reference|| / ||reference|| of the timed forward over n tokens, the
    reference one eager forward over the context and the n tokens with no cache: whether
    what was timed computes the model (compiled and captured, it differs by rounding)."""
    context, device = ids.shape[1], ids.device
    rewind(cache, context)
    if before is not None:
        before()
    logits = forward(**step_arguments(model, cache, context, n, device)).logits[0].float().clone()
    tokens = torch.cat([ids, torch.ones(1, n, dtype=torch.long, device=device)], dim=1)
    reference = model(input_ids=tokens, use_cache=False).logits[0, -n:].float()
    return float((logits - reference).norm() / reference.norm())


def measure(args: argparse.Namespace, write) -> dict:
    started = time.monotonic()
    model, name = build_model(args)
    device = next(model.parameters()).device
    compiled = device.type == "cuda" and not args.no_compile
    result = {
        "model": name,
        "random_weights": args.random_weights,
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "device": str(device),
        "device_name": _device_name(device),
        "torch": torch.__version__,
        "transformers": _transformers_version(),
        "context_tokens": args.context,
        "repeats": args.repeats,
        "compiled": compiled,
        "graph": _graph_words(device, compiled),
        "sizes": {str(n): {} for n in args.sizes},
        "left_out": [],
    }
    with torch.inference_mode():
        ids = context_ids(model, args.context, device)
        for n, ms in eager_dynamic(model, ids, args.sizes, args.repeats).items():
            result["sizes"][str(n)]["eager_dynamic_ms"] = round(ms, 4)
        write(result)
        key = "graph_ms" if compiled else "static_eager_ms"

        def done(n: int, ms: float | None) -> None:
            if ms is None:
                result["left_out"].append(n)
            else:
                result["sizes"][str(n)][key] = round(ms, 4)
            write(result)

        until = started + args.time_limit
        check = graph_sizes(model, ids, args.sizes, args.repeats, compiled, until, done)
        timed = [n for n in args.sizes if n not in result["left_out"]]
        if timed:  # the largest size timed, against an eager forward without a cache
            result["relative_difference"] = {str(timed[-1]): round(check(timed[-1]), 6)}
        write(result)
    return result


def _graph_words(device, compiled: bool) -> str:
    if compiled:  # by default torch.compile recompiles a changed size as symbolic, once
        return 'torch.compile(mode="reduce-overhead") over a StaticCache: a CUDA graph per n'
    if device.type == "cuda":
        return "StaticCache, eager (--no-compile)"
    return "StaticCache, eager: no CUDA graphs on a CPU, nothing compiled"


def _device_name(device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    from autotune.hardware import describe

    return describe("cpu")["device_name"]


def _transformers_version() -> str:
    import transformers

    return transformers.__version__


def parse_sizes(text: str) -> list[int]:
    try:
        sizes = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise AutotuneError(f"--sizes {text!r}: give token counts like 1,8,16") from None
    if not sizes or sizes[0] < 1:
        raise AutotuneError(f"--sizes {text!r}: give token counts of 1 or more")
    return sizes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="vicuna-13b", help="alias, folder or .gguf file")
    parser.add_argument("--model-path")
    parser.add_argument("--random-weights", action="store_true")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--context", type=int, default=CONTEXT_TOKENS)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument(
        "--time-limit",
        type=float,
        default=float("inf"),
        metavar="SECONDS",
        help="start no new size after this long (each size is compiled anew)",
    )
    parser.add_argument("--no-compile", action="store_true", help="time the static cache eagerly")
    parser.add_argument("--out", type=Path, help="also write the JSON here, after every size")
    args = parser.parse_args(argv)
    args.sizes = parse_sizes(args.sizes)

    def write(result: dict) -> None:
        if args.out is not None:
            write_atomic(args.out, json.dumps(result, indent=1) + "\n")

    print(json.dumps(measure(args, write), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(exit_status(main))
