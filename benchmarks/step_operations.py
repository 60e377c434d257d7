"""The torch operations inside one decoding step of the target, per layer (issue 40).

A recorded step replays its operations as kernels, one after another; on the embedded
model (30 layers of small products) a kernel's few microseconds of launch and tail, not
its arithmetic, set the step's time: on an H200 (2026-11-28) the recorded one-token step
of SmolLM2-135M replayed in 2.17 ms, about 72 us a layer. So the count of operations a
layer dispatches is what a change to the layers' arithmetic can be judged by on a CPU,
before a GPU times it. This counts them on the tiny random LLaMA with the embedded
model's 30 layers, one token after a 4-token prefill, eagerly (a CPU dispatches the
operations a GPU would record), as `around_steps.py` counts them: views, which launch
nothing, and the making of a tensor from a list left out.

    python benchmarks/step_operations.py [--dtype bfloat16] [--layers 30]

It prints the count as the CPU runs it and as a GPU would (the layers' rules for their
fused forms, ``layers.FUSION_RULES``, as they answer off the CPU), and what a GPU replays
for a token of greedy decoding (the fixed-shape step with its KV scatters, visibility
mask and the feed of its argmax), with the operations of each. On 2026-11-28: 826, 436
and 451 with the rotation in three operations; 826, 375 and 390 with it one product with
each position's matrix and the final norm fused; the step the H200 replayed that morning,
before the fused forms and the feed, counted 834 the same way.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools

import torch
from around_steps import Around  # benchmarks/ is on sys.path as a script

from autotune.engine import layers
from autotune.engine.decoding import decode_plain
from autotune.engine.runner import Runner
from autotune.models import tiny


def step_operations(dtype: torch.dtype, n_layers: int, as_on_gpu: bool) -> collections.Counter[str]:
    """The operations of one one-token forward after a prefill."""
    with rules_off_cpu(dtype) if as_on_gpu else contextlib.nullcontext():
        model = tiny.tiny_llama(layers=n_layers).to(dtype)
        runner = Runner(model)
        cache = runner.new_cache(capacity=64)
        with torch.inference_mode():
            runner.forward(torch.tensor([1, 5, 9, 33]), torch.arange(4), cache, last_only=True)
            mode = Around()  # no recorded runs here: it counts every operation
            with mode:
                runner.forward(torch.tensor([7]), torch.tensor([4]), cache)
        return mode.operations


def replayed_operations(dtype: torch.dtype, n_layers: int) -> collections.Counter[str]:
    """The operations of what a GPU replays for a token of greedy decoding: the fixed-shape
    one-token step that feeds its argmax to its next run (``StaticStep.decode_fed``), its
    buffers loaded by a decoding first, with the layers' fused forms as off the CPU."""
    with rules_off_cpu(dtype):
        model = tiny.tiny_llama(layers=n_layers).to(dtype)
        runner = Runner(model, static=True)
        runner.eos_token_ids = frozenset()
        decode_plain(runner, [1, 5, 9, 33], 4)  # records (on a CPU: makes) the fed step
        step = runner.static
        assert step is not None
        buffer, variant = step.buffers[1, 1], step.variant(feeds=True)
        mode = Around()
        with torch.inference_mode(), mode:
            step.compute(buffer, variant)
        return mode.operations


def rules_off_cpu(dtype: torch.dtype) -> contextlib.AbstractContextManager[None]:
    """Within it, each of the layers' fused-form rules answers for ``dtype`` as it does
    off the CPU (asked of a meta tensor first); other dtypes as before."""
    answers = {}
    for name in layers.FUSION_RULES:
        applies = getattr(layers, name)
        off_cpu = applies(torch.empty(0, dtype=dtype, device="meta"))
        answers[name] = functools.partial(_as_off_cpu, applies, dtype, off_cpu)
    return layers.forms_answered(answers)


def _as_off_cpu(applies, dtype: torch.dtype, off_cpu: bool, x: torch.Tensor) -> bool:
    return off_cpu if x.dtype == dtype else applies(x)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    # half precision: in float32 the CPU runs its own C++ decoder, not these layers
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    parser.add_argument("--layers", type=int, default=30)
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    counts = {
        "as the CPU runs it": step_operations(dtype, args.layers, as_on_gpu=False),
        "as a GPU runs it": step_operations(dtype, args.layers, as_on_gpu=True),
        "as a GPU replays a greedy token": replayed_operations(dtype, args.layers),
    }
    base = sum(counts["as the CPU runs it"].values())
    for label, count in counts.items():
        total = sum(count.values())
        print(
            f"{args.dtype}, {label}: {total} operations a step, {total / args.layers:.1f} a "
            f"layer ({total / base:.2f}x the CPU's)"
        )
        print("   ", ", ".join(f"{name} {n}" for name, n in count.most_common()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
