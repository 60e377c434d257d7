"""Every recorded step replayed as a CUDA graph replays it, on a CPU.

A CUDA graph replays the kernels its recording launched, over the same memory: whatever
the step's Python read while it was recorded (an int, a list, a cache's length, a tensor
made from host values) is frozen into the replay, and only what lives in the step's
buffers changes between replays. Off CUDA the recorder runs each step afresh
(``engine.capture``), which hides that whole class of fault; the GPU check finds it only
where a GPU is lent.

Here each step is traced once when it is recorded (``replay_site.sitecustomize.traced``:
``make_fx`` over the tensors it names, in torch's own kernels, the engine's C++ product
being opaque to a trace) and every later run replays the trace, with its Python values
frozen as a graph's are (that folder does the same for a whole run, Ray's workers
included). Then every method, with and without CAPE, must draft what its drafter drafts
beside the eager layers, proposal for proposal, and its greedy decoding, one request and
several at once, must equal plain greedy decoding by the eager layers, token for token or
parted at a numeric tie (``same_greedy``: the CPU's products are chosen by row count from
a table each machine measures, and round by about 1e-7 between them). Drafts are compared
only where no output parted.

Run after ``test_static_step.py`` in one process, self_spec's output here once parted from
plain greedy at token 0 or 1, far from a tie, in 2 runs of 3: a weight of this model
reusing the id of one that had taken the engine's C++ product kept that choice past the
``native.available`` this file turns off, and a trace cannot see a C++ call, so its product
was frozen (``kernels.KernelTable.kernel`` now asks at every product). A Medusa output
parting at token 4 in CI once was likely the same."""

from __future__ import annotations

import functools

import pytest
import torch
from replay_site.sitecustomize import traced
from test_drafter_contract import CAPE, Recorder, cases

from autotune.engine import capture, native
from autotune.engine.batched import decode_batch
from autotune.engine.decoding import decode_plain, decode_speculative
from autotune.engine.runner import Runner
from autotune.methods import registry
from autotune.methods.base import DraftEnv
from autotune.models.ref import TargetRef

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = [[1, 5, 9, 33, 70], [1, 100, 3, 3, 3, 100, 3], [1, 40, 41, 42, 43, 44]]
TOKENS = 20


class Replays:
    """How many steps were traced, and how many runs replayed a trace."""

    def __init__(self):
        self.traced = 0
        self.replayed = 0

    def make(self, step: functools.partial, statics: list[torch.Tensor]):
        """``Recorder.make`` off CUDA: the step traced over ``statics`` (its idle buffers
        as the recorder leaves them), the trace as the run."""
        run = traced(step, statics)
        self.traced += 1

        def counted() -> None:
            self.replayed += 1
            run()

        return counted


@pytest.fixture
def replays(monkeypatch) -> Replays:
    """Each recorded step's runs replayed from its trace; torch's kernels throughout."""
    counts = Replays()
    monkeypatch.setattr(native, "available", lambda build=True: False)
    monkeypatch.setattr(
        capture.Recorder, "make", lambda recorder, step, statics, what: counts.make(step, statics)
    )
    return counts


def test_a_replay_keeps_the_python_values_of_its_recording(replays):
    """What the replays stand for: a value the step read on the host stays as it was
    when recorded; a value in its buffers is read afresh at every run."""
    held = {"host": 1.0}
    device_value, out = torch.ones(1), torch.zeros(2)

    def step() -> None:
        out[0] = held["host"]
        out[1] = device_value[0]

    run = capture.Recorder(torch.device("cpu")).make(
        functools.partial(step), [device_value, out], "a test step"
    )
    assert run is not None and replays.traced == 1
    held["host"], device_value[0] = 5.0, 7.0
    run()
    assert out.tolist() == [1.0, 7.0]


# every method in the CPU's forms of the layers' arithmetic, two again in the fused forms
# a GPU takes (``gpus_arithmetic``: the residual added in place inside the traced step)
CASES = [pytest.param(*case.values, False, id=case.id) for case in cases()] + [
    pytest.param(name, False, True, id=f"{name} in a GPU's forms") for name in ("eagle", "medusa")
]


@pytest.mark.parametrize("name,cape,gpu_forms", CASES)
def test_every_method_drafts_and_decodes_as_the_eager_layers_from_replayed_steps(
    replays, tiny_llama_dir, tmp_path, name, cape, gpu_forms, same_greedy, request
):
    """The same drafts as the drafter beside eager layers, proposal for proposal (a
    drafter's stale step would only lower its acceptance: the output stays lossless),
    and plain greedy output, alone and batched."""
    if gpu_forms:
        request.getfixturevalue("gpus_arithmetic")
    ref = TargetRef.for_user(str(tiny_llama_dir))
    model = ref.load().model
    eager = Runner(model, native=False, static=False)
    replayed = Runner(model, native=False, static=True)  # its heads' steps follow its own
    assert replayed.static is not None and eager.static is None
    for each in (eager, replayed):
        each.eos_token_ids = frozenset()
    plain = [decode_plain(eager, p, TOKENS).tokens for p in PROMPTS]
    method = registry.get(name)
    for label, settings in method.examples(model, tmp_path).items():
        if cape:
            settings = settings.model_copy(
                update={"cape": CAPE.model_copy(update={"chain_depth": 3})}
            )
        drafts, parted = {}, False
        for each in (eager, replayed):
            make = method.deployed_drafter(settings, DraftEnv(ref, each))
            drafter = Recorder(make())
            for prompt, expected in zip(PROMPTS, plain):
                out = decode_speculative(each, drafter, prompt, TOKENS).tokens
                same_greedy(each, prompt, out, expected, (label, prompt))
                parted = parted or out != expected  # at a tie: the drafts part there too
            drafts[each] = [(d.tokens, d.shape.parents) for d in drafter.drafts]
        if not parted:
            assert drafts[replayed] == drafts[eager], label
        make = method.deployed_drafter(settings, DraftEnv(ref, replayed))
        run = decode_batch(replayed, PROMPTS, TOKENS, 2, make)
        for prompt, result, want in zip(PROMPTS, run.results, plain, strict=True):
            same_greedy(replayed, prompt, result.tokens, want, label)
    # the steps were recorded, and most runs were replays of a recording
    assert replays.traced and replays.replayed > 2 * replays.traced


def test_greedy_decoding_fed_on_the_device_from_a_replayed_step(replays, tiny_llama_dir):
    """The one-token step that feeds its argmax to its next run, replayed as a graph
    replays it: the token, position, column and count it advances live in its buffers,
    so each replay decodes the next token, as the eager layers do."""
    model = TargetRef.for_user(str(tiny_llama_dir)).load().model
    eager = Runner(model, native=False, static=False)
    replayed = Runner(model, native=False, static=True)
    for each in (eager, replayed):
        each.eos_token_ids = frozenset()
    traced = replays.traced
    for prompt in PROMPTS:
        result = decode_plain(replayed, prompt, TOKENS)
        assert result.tokens == decode_plain(eager, prompt, TOKENS).tokens
        assert result.steps == TOKENS - 1
    assert replayed.static is not None and replayed.static.calls[1] == len(PROMPTS) * (TOKENS - 1)
    assert replays.replayed >= len(PROMPTS) * (TOKENS - 1) and replays.traced - traced <= 3
