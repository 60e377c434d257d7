"""What runs around the recorded steps (issue 40): the torch operations each method's
greedy decoding dispatches outside the fixed-shape steps' runs, per target forward.

On a GPU a recorded step replays as one launch; each operation around it (loading a
call's inputs, copying outputs out, moving a tree's accepted entries, the drafters'
own work) is a launch more, paid on every forward, and the reads back to the host
(``.item()``, ``.tolist()``) are each a wait for the device. This counts both on the
tiny random LLaMA, with as many layers as the embedded model (30), every step on
(eagerly on a CPU, which dispatches the same operations a GPU would), for every
registered method's first example setting (``--every-example``: each of them, and
EAGLE's published trees on its example head):

    python benchmarks/around_steps.py [--tokens 48] [--layers 30] [--every-example] [--json]
        [--device cuda --dtype bfloat16]

It also times the host's part: each decoding again with the recorded runs skipped (their
outputs stale), its wall time per target forward. On a GPU that is what the host must do
between replays, however fast the device; where it exceeds a replay, the GPU waits.
With ``--device cuda --dtype bfloat16`` the same runs on a GPU: the steps are recorded as
CUDA graphs (and skipped when timed), and every operation around them is a real launch
and every read a real wait, as a serving GPU's host pays them.

Views (slices, ``.numpy()``'s detach) and making a tensor from a list are not counted.
On a CPU every tensor is the host's, so operations on tensors a GPU run keeps on the
host (a mask built from lists before it is sent) are counted too: on a GPU the launches
are at most these figures.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from autotune.engine import capture, staging
from autotune.engine.decoding import decode_plain, decode_speculative
from autotune.engine.runner import Runner
from autotune.methods import registry
from autotune.methods.base import DraftEnv
from autotune.models import tiny
from autotune.models.ref import TargetRef

PROMPT = [1, 5, 9, 33, 70, 4, 8, 1, 5, 9, 33]
READS = {"aten._local_scalar_dense", "aten.item", "Tensor.tolist", "staging.read_back"}
# what ``torch.tensor(list)`` dispatches on a CPU: where it is made on the host, no device
# work; made on a GPU, a copy the count here cannot see (the old decoders made two a token)
MAKING = {torch.ops.aten.detach_, torch.ops.aten.lift_fresh}


class Around(TorchDispatchMode):
    """Counts the non-view operations dispatched outside recorded runs (``inside`` > 0
    while one runs), and the reads back to the host among them."""

    def __init__(self):
        super().__init__()
        self.inside = 0
        self.free = False  # skip the recorded runs: time the host's part alone
        self.operations: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.inside and not func.is_view and func.overloadpacket not in MAKING:
            self.operations[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def counting_reads(mode: Around) -> None:
    """``Tensor.tolist`` reads without dispatching an operation on a CPU, and
    ``staging.read_back`` copies on the host (on a GPU each copies to the host): each
    call outside a recorded run is counted as one read."""
    tolist, read_back = torch.Tensor.tolist, staging.read_back

    def counted(self):
        if not mode.inside:
            mode.operations["Tensor.tolist"] += 1
        return tolist(self)

    def counted_back(values):
        if not mode.inside:
            mode.operations["staging.read_back"] += 1
        return read_back(values)  # on a CPU a view and numpy's copy: no operation counted

    torch.Tensor.tolist = counted  # type: ignore[method-assign]
    staging.read_back = counted_back


def counting_runs(mode: Around) -> None:
    """Every run a Recorder makes from now on marks itself inside while it runs."""
    make = capture.Recorder.make

    def made(self, step, statics, what):
        run = make(self, step, statics, what)
        if run is None:
            return None

        def marked():
            mode.inside += 1
            try:
                if not mode.free:
                    run()
            finally:
                mode.inside -= 1

        return marked

    capture.Recorder.make = made  # type: ignore[method-assign]


def tiny_model(folder: Path, layers: int, device: str = "cpu", dtype: str = "float32") -> TargetRef:
    tiny.tiny_llama(layers=layers).save_pretrained(folder / "tiny-llama")
    tiny.tiny_tokenizer().save_pretrained(folder / "tiny-llama")
    return TargetRef.for_user(str(folder / "tiny-llama"), dtype=dtype, device=device)


def measure(
    tokens: int,
    layers: int,
    every_example: bool = False,
    device: str = "cpu",
    dtype: str = "float32",
) -> dict[str, dict]:
    torch.set_num_threads(1)
    mode = Around()
    counting_runs(mode)
    counting_reads(mode)
    rows: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        ref = tiny_model(folder, layers, device, dtype)
        runner = Runner(ref.runner().model, static=True)
        runner.eos_token_ids = frozenset()  # every decoding runs its full length
        decoders = {"plain greedy": lambda: decode_plain(runner, PROMPT, tokens)}
        for name, method in registry.methods().items():
            examples = list(method.examples(runner.model, folder / name).items())
            if every_example and name == "eagle":
                examples += published_trees(examples[0][1])
            for label, settings in examples if every_example else examples[:1]:
                new_drafter = method.deployed_drafter(settings, DraftEnv(ref, runner))
                decoders[f"{name} ({label})"] = lambda new=new_drafter: decode_speculative(
                    runner, new(), PROMPT, tokens
                )
        for name, decode in decoders.items():
            decode()  # warm-up: every shape's step made before counting
            mode.operations.clear()
            with mode:
                result = decode()
            forwards = result.steps + 1  # and the prefill
            total = sum(mode.operations.values())
            reads = sum(n for op, n in mode.operations.items() if op in READS)
            # taken before the host's timing, whose decodings count their reads too
            top = dict(mode.operations.most_common(4))
            rows[name] = {
                "target_forwards": forwards,
                "tokens_per_forward": round(len(result.tokens) / forwards, 2),
                "operations_per_forward": round(total / forwards, 1),
                "host_reads_per_forward": round(reads / forwards, 1),
                "host_us_per_forward": round(host_seconds(mode, decode) * 1e6),
                "top": top,
            }
    return rows


def host_seconds(mode: Around, decode, repeats: int = 5) -> float:
    """The fastest of ``repeats`` decodings with the recorded runs skipped, per target
    forward (the stale outputs change what is accepted, so the count is its own)."""
    mode.free = True
    try:
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            result = decode()
            best = min(best, (time.perf_counter() - start) / (result.steps + 1))
        return best
    finally:
        mode.free = False


def published_trees(example) -> list[tuple[str, object]]:
    """EAGLE-1's static tree and EAGLE-2's 60/5/10 on the example's head, over the
    whole vocabulary (``_defaults``: the defaults a tuned tree is compared with)."""
    from _defaults import EAGLE_DEFAULTS

    from autotune.methods.eagle.settings import tree_block

    return [
        (label, example.model_copy(update={"tree": tree_block(tree), "draft_vocab": 0}))
        for label, tree in EAGLE_DEFAULTS.items()
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=48, help="tokens each decoding makes")
    parser.add_argument("--layers", type=int, default=30, help="decoder layers (SmolLM2-135M: 30)")
    parser.add_argument("--every-example", action="store_true", help="each example setting")
    parser.add_argument(
        "--device", default="cpu", help="cuda: the host's time with real launches and reads"
    )
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rows = measure(args.tokens, args.layers, args.every_example, args.device, args.dtype)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(
        f"{'decoding':<28} {'forwards':>8} {'tok/fwd':>7} {'ops/fwd':>7} {'reads/fwd':>9} "
        f"{'host us/fwd':>11}"
    )
    for name, row in rows.items():
        print(
            f"{name:<28} {row['target_forwards']:>8} {row['tokens_per_forward']:>7} "
            f"{row['operations_per_forward']:>7} {row['host_reads_per_forward']:>9} "
            f"{row['host_us_per_forward']:>11}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
