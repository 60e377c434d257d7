"""The fixed-shape step (``engine.static``) and its buckets (``engine.buckets``), run
eagerly on the CPU against the runner's own layers: the same logits for one token, a
padded chain, a tree, after crop and keep; the same greedy tokens, plain and speculative;
the calls it cannot run left to the eager layers; and no value read back to the host
inside the step. Recording it as a CUDA graph (or compiling it) needs a GPU: not here."""

from __future__ import annotations

import collections

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from autotune.engine import buckets, staging, static
from autotune.engine.decoding import cache_capacity, decode_plain, decode_speculative
from autotune.engine.runner import Runner
from autotune.engine.segment import Segment
from autotune.engine.skip import SkipMask
from autotune.engine.tree import TreeShape
from autotune.methods import registry
from autotune.methods.base import DraftEnv
from autotune.models.ref import TargetRef

pytestmark = pytest.mark.usefixtures("one_thread", "on_device")

# On a GPU machine (the GPU check runs this file there) every test runs on the GPU, where
# the step is recorded as CUDA graphs: the same comparisons then test the recording
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def on_device():
    """Models and tensors made on ``DEVICE`` unless a test says otherwise."""
    before = torch.get_default_device()
    torch.set_default_device(DEVICE)
    yield
    # None, not the CPU device: naming any device leaves a device mode on every later
    # torch call of the session (which runs patched methods twice, for one)
    torch.set_default_device(None if before.type == "cpu" else before)


PROMPT = [1, 5, 9, 33, 70, 4, 8]
TREE = TreeShape.from_choices([[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]])


# --- buckets -------------------------------------------------------------------------


def test_each_count_takes_the_smallest_bucket_that_holds_it():
    assert [buckets.bucket_for(n) for n in (1, 2, 3, 4, 5, 7, 9, 33, 64)] == [
        1,
        2,
        3,
        4,
        6,
        8,
        12,
        48,
        64,
    ]
    assert buckets.bucket_for(65) is None
    for n in range(1, buckets.LARGEST + 1):
        size = buckets.bucket_for(n)
        assert size is not None and n <= size <= 1.5 * n  # padding costs at most half again
    with pytest.raises(ValueError):
        buckets.bucket_for(0)


def test_a_fixed_cache_holds_its_entries_and_the_scratch_column_rounded_up():
    assert buckets.static_columns(1) == 256
    assert buckets.static_columns(255) == 256
    assert buckets.static_columns(256) == 512  # the scratch column needs one more
    assert buckets.decoding_columns(100, 300) == 512  # 100 + 300 + 64 + 1
    # what the decoders ask the runner for gives a decoding's columns
    prompt = list(range(40))
    asked = cache_capacity(prompt, 200)
    assert buckets.static_columns(asked) == buckets.decoding_columns(len(prompt), 200)


# --- the step against the eager layers ----------------------------------------------


@pytest.fixture
def pair(tiny_llama):
    """The tiny LLaMA's eager runner and its static one (float32, on ``DEVICE``)."""
    return Runner(tiny_llama, static=False), Runner(tiny_llama, static=True)


class Twin:
    """The same calls on an eager runner's cache and a static runner's, compared."""

    def __init__(self, eager: Runner, fixed: Runner, capacity: int = 100):
        self.eager, self.fixed = eager, fixed
        self.eager_cache, self.fixed_cache = eager.new_cache(capacity), fixed.new_cache(capacity)

    def forward(self, tokens, start: int, mask=None, positions=None):
        tokens = torch.tensor(tokens)
        if positions is None:
            positions = torch.arange(start, start + len(tokens))
        a = self.eager.forward(tokens, positions, self.eager_cache, mask=mask)
        b = self.fixed.forward(tokens, positions, self.fixed_cache, mask=mask)
        torch.testing.assert_close(b.logits, a.logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(b.hidden, a.hidden, rtol=1e-5, atol=1e-5)
        assert self.fixed_cache.lengths == self.eager_cache.lengths

    def crop(self, length: int) -> None:
        self.eager_cache.crop(length)
        self.fixed_cache.crop(length)

    def keep(self, start: int, rows: list[int]) -> None:
        self.eager_cache.keep(start, torch.tensor(rows))
        self.fixed_cache.keep(start, torch.tensor(rows))


@pytest.fixture(params=["as made", "on the device"])
def inputs_made(request, monkeypatch):
    """``on the device``: a step takes every input as a GPU caller's device tensors
    (copied after the host's one copy, ``engine.staging``), on a CPU too."""
    if request.param == "on the device":
        monkeypatch.setattr(staging, "on_host", lambda values: False)
    return request.param


@pytest.mark.usefixtures("inputs_made")
def test_step_logits_equal_the_eager_layers(pair):
    eager, fixed = pair
    twin = Twin(eager, fixed)
    calls = fixed.static.calls
    twin.forward(PROMPT, 0)  # a 7-token prefill, causal: bucket 8
    assert calls == {8: 1}
    twin.forward([11], 7)
    assert calls[1] == 1
    twin.forward([12, 13, 14, 15, 16], 8)  # a chain of 5, padded to 6
    assert calls[6] == 1
    committed = 13
    positions = committed + TREE.position_offsets(DEVICE)
    twin.forward([20, 21, 22, 23, 24, 25, 26], committed, TREE.attention_mask(DEVICE), positions)
    assert calls[8] == 2
    twin.keep(committed, [0, 1, 3, 6])  # the root, node 0, its child 2, its child 5
    assert fixed.static.fits([Segment(torch.tensor([1]), torch.tensor([17]), twin.fixed_cache)])
    twin.forward([30], 17)
    twin.crop(10)
    twin.forward([40, 41, 42], 10)
    assert sum(calls.values()) == 6  # every call ran in the step


def test_padded_rows_write_only_the_scratch_column(pair):
    fixed = pair[1]
    cache = fixed.new_cache(100)
    fixed.forward(torch.tensor(PROMPT[:5]), torch.arange(5), cache)  # 5 of bucket 6
    scratch = fixed.static.columns - buckets.SCRATCH_COLUMNS
    for store in (*cache.keys, *cache.values):
        written = store[0].abs().sum(dim=(0, 2)) > 0  # per column
        assert written[:5].all() and written[scratch]
        assert not written[5:scratch].any()


def test_greedy_decoding_is_token_identical_with_the_step(pair, same_greedy):
    eager, fixed = pair
    prompts = [PROMPT, [1, 100, 3], [1, *range(40, 60)]]
    for prompt in prompts:
        # as long as a 512-column storage holds: the decoding's capacity, a draft's room
        # and the scratch column fill it exactly
        new_tokens = 512 - len(prompt) - buckets.LARGEST - buckets.SCRATCH_COLUMNS
        expected = decode_plain(eager, prompt, new_tokens).tokens
        same_greedy(fixed, prompt, decode_plain(fixed, prompt, new_tokens).tokens, expected)
        assert len(expected) == new_tokens  # tiny's end-of-sequence token never came
        assert fixed.static.columns == 512
    assert set(fixed.static.calls) == {1, 3, 8, 24}  # the prompts (3, 7, 21) and decode


def test_greedy_decoding_feeds_each_token_to_the_next_step_on_the_device(
    pair, monkeypatch, no_host_reads
):
    """After the prefill, plain greedy decoding runs the one-token step with each token
    its argmax fed to the next run on the device: no call of the step's loader, nothing
    read back inside a run, the same tokens as the eager layers; an end-of-sequence
    token ends it with one run queued past it, outside the cache's length."""
    eager, fixed = pair
    loads = []
    load = static.StepBuffers.load
    monkeypatch.setattr(
        static.StepBuffers, "load", lambda buffer, *args: loads.append(1) or load(buffer, *args)
    )
    for runner in pair:
        runner.eos_token_ids = frozenset()
    expected = decode_plain(eager, PROMPT, 30).tokens
    fed = decode_plain(fixed, PROMPT, 30)
    assert fed.tokens == expected and fed.steps == 29
    assert len(loads) == 2 and fixed.static.calls[1] == 29  # the prefill's, the feed's
    # stopped by a token: the runs fed, one past it; the cache as long as the tokens taken
    cache = fixed.new_cache(100)
    fixed.forward(torch.tensor(PROMPT), torch.arange(len(PROMPT)), cache)
    stop = expected[5]
    runs = fixed.static.calls[1]
    with no_host_reads():
        taken = fixed.static.decode_fed(cache, expected[0], len(PROMPT), 20, stop.__eq__)
    first = expected[1:].index(stop) + 1
    assert taken == expected[1 : first + 1]
    assert fixed.static.calls[1] - runs == len(taken) + 1
    assert cache.lengths == [len(PROMPT) + len(taken)] * len(cache.lengths)
    eos = frozenset({stop})
    fixed.eos_token_ids = eager.eos_token_ids = eos
    assert decode_plain(fixed, PROMPT, 30).tokens == decode_plain(eager, PROMPT, 30).tokens


def test_a_call_past_the_scratch_column_moves_the_cache_out_and_stays_exact(pair):
    eager, fixed = pair
    twin = Twin(eager, fixed, capacity=40)
    columns = fixed.static.columns
    length = columns - buckets.SCRATCH_COLUMNS - 3
    drawn = torch.randint(3, 120, (length,), generator=torch.Generator(), device="cpu")
    tokens = [int(t) for t in drawn]
    twin.forward(tokens, 0)  # past the largest bucket: eager, into the lent storage
    assert twin.fixed_cache.on_loan
    assert twin.fixed_cache.keys[0].data_ptr() == fixed.static.keys[0].data_ptr()  # lane 0
    twin.forward([5, 6, 7], length)  # the last three columns before the scratch one
    before = sum(fixed.static.calls.values())
    twin.forward([8, 9], length + 3)  # would write the scratch column: eager, and it grows
    assert not twin.fixed_cache.on_loan
    assert twin.fixed_cache.capacity > columns
    twin.forward([10], length + 5)
    assert sum(fixed.static.calls.values()) == before  # neither ran in the step


def test_an_eager_write_onto_the_scratch_column_moves_the_cache_out(pair):
    """A prefill past the largest bucket runs eagerly into the lent lane; one that would
    reach the lane's scratch column (which padded rows overwrite) moves out first."""
    eager, fixed = pair
    twin = Twin(eager, fixed, capacity=40)
    columns = fixed.static.columns
    drawn = torch.randint(3, 120, (columns,), generator=torch.Generator(), device="cpu")
    twin.forward([int(t) for t in drawn], 0)
    assert not twin.fixed_cache.on_loan
    twin.forward([5], columns)


def test_sequences_alive_together_take_lanes_and_keep_their_entries(pair):
    """A second cache takes a second lane: the storage grows, the first cache's entries
    move with it, and both keep running in the step. Past the last lane, the sequence
    lent its lane longest ago moves out, and runs eagerly, as exactly."""
    eager, fixed = pair
    twin = Twin(eager, fixed)
    twin.forward(PROMPT, 0)
    other = Twin(eager, fixed)
    other.forward([9, 9, 9], 0)
    assert (twin.fixed_cache.lane, other.fixed_cache.lane) == (0, 1)
    assert fixed.static.storage.lanes == 2 and twin.fixed_cache.on_loan
    before = sum(fixed.static.calls.values())
    twin.forward([11, 12], len(PROMPT))  # in the step, on the entries that moved
    other.forward([10], 3)
    assert sum(fixed.static.calls.values()) == before + 2
    crowd = [Twin(eager, fixed, capacity=20) for _ in range(buckets.LANES[-1] - 2)]
    assert fixed.static.storage.lanes == buckets.LANES[-1] and twin.fixed_cache.on_loan
    crowd.append(Twin(eager, fixed, capacity=20))  # one more than the lanes
    assert not twin.fixed_cache.on_loan and crowd[-1].fixed_cache.lane == 0
    twin.forward([13], len(PROMPT) + 2)  # eager now, on the entries it moved out
    other.forward([14, 15], 4)


LONG_PROMPT = [1 + (7 * i) % 90 for i in range(150)]  # past the largest bucket: in parts


def test_a_prefill_longer_than_the_largest_bucket_runs_in_parts(pair, same_greedy):
    """150 tokens as parts of 64, 64 and 22 (bucket 24), each reading what the parts
    before it wrote: the eager layers' logits and hidden states for every token, and for
    a prefill's last token with Medusa's extra rows; the same greedy tokens after it."""
    eager, fixed = pair
    twin = Twin(eager, fixed, capacity=300)
    twin.forward(LONG_PROMPT, 0)
    assert fixed.static.calls == {64: 2, 24: 1}
    twin.forward([11], len(LONG_PROMPT))
    ids, positions = torch.tensor(LONG_PROMPT), torch.arange(len(LONG_PROMPT))
    outputs = [
        runner.forward(ids, positions, runner.new_cache(300), last_only=True, extra_rows=doubled)
        for runner in pair
    ]
    for got, want in zip(outputs[1:], outputs):
        torch.testing.assert_close(got.logits, want.logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got.extra_logits, want.extra_logits, rtol=1e-5, atol=1e-5)
        assert got.logits.shape[0] == 1 and got.hidden.shape[0] == len(LONG_PROMPT)
    assert sum(fixed.static.calls.values()) == 7
    got = decode_plain(fixed, LONG_PROMPT, 20).tokens
    same_greedy(fixed, LONG_PROMPT, got, decode_plain(eager, LONG_PROMPT, 20).tokens)
    # more tokens than its lane holds: the whole call takes the eager layers
    before, many = sum(fixed.static.calls.values()), fixed.static.columns
    ids, positions = torch.tensor(LONG_PROMPT * 4)[:many], torch.arange(many)
    got = fixed.forward(ids, positions, fixed.new_cache(300), last_only=True)
    want = eager.forward(ids, positions, eager.new_cache(300), last_only=True)
    torch.testing.assert_close(got.logits, want.logits, rtol=1e-5, atol=1e-5)
    assert sum(fixed.static.calls.values()) == before


def test_calls_the_step_cannot_run_take_the_eager_layers(pair):
    eager, fixed = pair
    twin = Twin(eager, fixed)
    twin.forward(PROMPT, 0)
    before = dict(fixed.static.calls)
    seen = torch.ones(2, len(PROMPT) + 2, dtype=torch.bool)
    seen[:, 1] = False  # a prefix column hidden: a [S, P + S] mask, as the proxy's
    twin.forward([11, 12], len(PROMPT), mask=seen.tril(diagonal=len(PROMPT)))
    twin.crop(len(PROMPT))
    every = SkipMask.of(attention=range(eager.num_layers))  # no attention: no prefix
    ids, positions = torch.tensor([11, 12]), torch.arange(len(PROMPT), len(PROMPT) + 2)
    a = eager.forward(ids, positions, twin.eager_cache, skip=every)
    b = fixed.forward(ids, positions, twin.fixed_cache, skip=every)
    torch.testing.assert_close(b.logits, a.logits, rtol=1e-5, atol=1e-5)
    assert dict(fixed.static.calls) == before


def doubled(normed):
    """Extra rows as Medusa's heads make them: blocks of the call's rows."""
    return torch.cat([normed, 2 * normed])


def test_skipped_sublayers_and_extra_rows_run_in_the_step(pair):
    """A layer-skip draft's calls (skipped layers neither read nor write their cache, and
    lag until verification crops them) and Medusa's extra rows, as the eager layers."""
    eager, fixed = pair
    twin = Twin(eager, fixed)
    twin.forward(PROMPT, 0)
    before = sum(fixed.static.calls.values())
    skip = SkipMask.of(attention=[1], mlp=[0, 2])
    for i, token in enumerate([11, 12, 13]):  # three draft steps under the mask
        position = torch.tensor([len(PROMPT) + i])
        a = eager.forward(torch.tensor([token]), position, twin.eager_cache, skip=skip)
        b = fixed.forward(torch.tensor([token]), position, twin.fixed_cache, skip=skip)
        torch.testing.assert_close(b.logits, a.logits, rtol=1e-5, atol=1e-5)
        assert twin.fixed_cache.lengths == twin.eager_cache.lengths
    assert twin.fixed_cache.lengths[1] == len(PROMPT)  # the skipped attention's layer
    twin.crop(len(PROMPT))  # as verification does
    ids, positions = torch.tensor([11, 12, 13]), torch.arange(len(PROMPT), len(PROMPT) + 3)
    a = eager.forward(ids, positions, twin.eager_cache, extra_rows=doubled)
    b = fixed.forward(ids, positions, twin.fixed_cache, extra_rows=doubled)
    torch.testing.assert_close(b.logits, a.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(b.extra_logits, a.extra_logits, rtol=1e-5, atol=1e-5)
    assert b.extra_logits.shape == (6, eager.config.vocab_size)  # not the bucket's 8
    assert sum(fixed.static.calls.values()) == before + 4


def test_the_least_recent_variants_steps_are_dropped(pair):
    """A layer-skip search makes a new mask every trial: the step keeps the plain step
    and the few most recent variants, not one per mask ever tried."""
    fixed = pair[1]
    step = fixed.static
    cache = fixed.new_cache(100)
    fixed.forward(torch.tensor(PROMPT), torch.arange(len(PROMPT)), cache)
    masks = [SkipMask.of(mlp=[layer]) for layer in range(fixed.num_layers)]
    masks += [SkipMask.of(attention=[layer]) for layer in range(fixed.num_layers)]
    assert len(masks) > static.KEPT_VARIANTS + 1
    for skip in masks:
        fixed.forward(torch.tensor([3]), torch.tensor([len(PROMPT)]), cache, skip=skip)
        cache.crop(len(PROMPT))
    kept = {variant for *_, variant in step._runs}
    assert step.variant() in kept  # the plain step (the prompt's bucket) stays
    recent = masks[-static.KEPT_VARIANTS :]
    assert kept - {step.variant()} == {step.variant(skip) for skip in recent}


@pytest.mark.parametrize("name", ["ngram", "self_spec", "medusa"])
def test_speculative_decoding_is_token_identical_with_the_step(
    tiny_llama_dir, tmp_path, name, same_greedy
):
    """Verification through the step: the n-gram drafter's chains and trees, layer skip's
    drafts (its skip mask a variant of the step) beside verification on one cache, and
    Medusa's trees with its heads' logits made in the verify step's lm_head product."""
    ref = TargetRef.for_user(str(tiny_llama_dir), dtype="float32", device=DEVICE)
    eager = Runner(ref.runner().model, static=False)
    fixed = Runner(eager.model, static=True)
    method = registry.get(name)
    prompts = [[1, 100, 3, 3, 3, 100, 3], [1, 40, 41, 42, 43, 44], PROMPT]
    verified = collections.Counter()  # buckets of the verify calls the step ran
    for settings in method.examples(eager.model, tmp_path).values():
        for prompt in prompts:
            expected = decode_plain(eager, prompt, 60).tokens
            drafter = method.deployed_drafter(settings, DraftEnv(ref, fixed))()
            before = collections.Counter(fixed.static.calls)
            got = decode_speculative(fixed, drafter, prompt, 60).tokens
            same_greedy(fixed, prompt, got, expected, settings)
            verified += fixed.static.calls - before
            verified[buckets.bucket_for(len(prompt))] -= 1  # its prefill
    assert sum(count for size, count in verified.items() if size > 1) > 0
    variants = {variant for *_, variant in fixed.static._runs} - {fixed.static.variant()}
    kinds = {
        "skips" if not all(v.attends + v.mlps) else "extra rows" if v.extra_rows else "?"
        for v in variants
    }
    assert kinds == {"ngram": set(), "self_spec": {"skips"}, "medusa": {"extra rows"}}[name]


# --- no host reads inside the step --------------------------------------------------


class NoHostReads(TorchDispatchMode):
    """Fails any operation that reads a tensor's value back to the host: ``.item()``,
    ``int(t)``, ``bool(t)`` (one scalar read), and the operations whose output size
    depends on values (``nonzero``, boolean indexing, ``masked_select``, ``unique``)."""

    INDEXING = frozenset(
        {torch.ops.aten.index, torch.ops.aten.index_put, torch.ops.aten.index_put_}
    )

    READS = frozenset(
        {
            torch.ops.aten.item,  # as it reaches the mode under inference_mode
            torch.ops.aten._local_scalar_dense,  # and outside it
            torch.ops.aten.nonzero,
            torch.ops.aten.masked_select,
            torch.ops.aten.equal,
            torch.ops.aten.is_nonzero,
            torch.ops.aten._unique2,
            torch.ops.aten.unique_consecutive,
        }
    )

    def masked(self, func, args) -> bool:
        """Indexing by a boolean mask: its nonzero entries are counted on the host."""
        if func.overloadpacket not in self.INDEXING:
            return False
        return any(i is not None and i.dtype in (torch.bool, torch.uint8) for i in args[1])

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in self.READS or self.masked(func, args):
            raise AssertionError(f"{func} reads a tensor's value on the host")
        return func(*args, **(kwargs or {}))


@pytest.fixture
def no_host_reads(monkeypatch):
    def refuse(self, *args, **kwargs):
        raise AssertionError("tolist reads a tensor's values on the host")

    monkeypatch.setattr(torch.Tensor, "tolist", refuse)
    return NoHostReads


@pytest.mark.parametrize("inference", [False, True])
def test_the_guard_catches_host_reads(no_host_reads, inference):
    with torch.inference_mode(inference):  # the step runs under inference_mode
        value = torch.ones(3)
        for read in (
            lambda: value.sum().item(),
            lambda: int(value[0]),
            lambda: bool(value[0] > 0),
            lambda: value[value > 0],
            lambda: value.tolist(),
        ):
            with pytest.raises(AssertionError), no_host_reads():
                read()


@torch.inference_mode()
def test_the_step_reads_nothing_back_to_the_host(pair, no_host_reads):
    fixed = pair[1]
    cache = fixed.new_cache(100)
    fixed.forward(torch.tensor(PROMPT), torch.arange(len(PROMPT)), cache)
    calls = sum(fixed.static.calls.values())
    for n, mask in ((1, None), (5, None), (7, TREE.attention_mask(DEVICE))):
        cache.crop(len(PROMPT))
        ids, positions = torch.arange(n) + 3, torch.arange(n) + len(PROMPT)
        with no_host_reads():  # the copy-in, the step (what a graph replays) and the copy-out
            fixed.forward(ids, positions, cache, mask=mask)
    assert sum(fixed.static.calls.values()) == calls + 3


class Operations(TorchDispatchMode):
    """Records every operation that is not a view (on a GPU, each is a launch)."""

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view:
            self.seen.append(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


@torch.inference_mode()
def test_a_call_s_inputs_reach_the_device_in_one_copy(pair, monkeypatch):
    """On a GPU every fill or copy into the step's buffers is a launch around the replay:
    a call made on the host (``Runner.input_device``) loads in one copy, a tree's mask
    included (the loader used to take ten operations a decode step)."""
    fixed = pair[1]
    host = fixed.input_device
    assert host == torch.device("cpu")  # on a GPU too: the step sends them
    cache = fixed.new_cache(100)
    fixed.forward(torch.tensor(PROMPT, device=host), torch.arange(len(PROMPT), device=host), cache)
    loads = Operations()
    load = static.StepBuffers.load

    def counted(*args):
        with loads:
            load(*args)

    monkeypatch.setattr(static.StepBuffers, "load", counted)
    for n, mask in ((1, None), (5, None), (7, TREE.attention_mask(host))):
        cache.crop(len(PROMPT))
        ids, positions = torch.arange(n, device=host) + 3, torch.arange(n, device=host) + 7
        fixed.forward(ids, positions, cache, mask=mask)
    assert loads.seen == ["aten.copy_"] * 3


@torch.inference_mode()
def test_a_tree_s_accepted_path_moves_in_every_layer_at_once(pair):
    """After a tree's verification, its accepted path's entries move to the committed
    length in one index_select and one copy each for keys and values, whatever the
    layers (on a GPU: launches, each layer's four cost as much as the verify step); the
    next forward sees them as the eager cache's."""
    eager, fixed = pair
    twin = Twin(eager, fixed)
    twin.forward(PROMPT, 0)
    committed = len(PROMPT)
    positions = committed + TREE.position_offsets(DEVICE)
    twin.forward([20, 21, 22, 23, 24, 25, 26], committed, TREE.attention_mask(DEVICE), positions)
    with Operations() as moves:
        twin.fixed_cache.keep(committed, torch.tensor([0, 1, 3, 6]))
    twin.eager_cache.keep(committed, torch.tensor([0, 1, 3, 6]))
    assert moves.seen.count("aten.index_select") == moves.seen.count("aten.copy_") == 2
    assert len(moves.seen) <= 6  # besides them: the index moved to the device, its offset
    assert (
        twin.fixed_cache.lengths == twin.eager_cache.lengths == [committed + 4] * eager.num_layers
    )
    twin.forward([30], committed + 4)


# --- where the step runs --------------------------------------------------------------


def test_the_step_is_on_by_default_on_gpus_only(tiny_llama, monkeypatch):
    tiny_llama.cpu()
    assert Runner(tiny_llama).static is None  # the CPU path as it was
    monkeypatch.delenv(static.SWITCH_ENV, raising=False)
    assert static.enabled_by_default(torch.device("cuda"))
    assert not static.enabled_by_default(torch.device("cpu"))
    monkeypatch.setenv(static.SWITCH_ENV, "0")
    assert not static.enabled_by_default(torch.device("cuda"))
    monkeypatch.setenv(static.SWITCH_ENV, "1")  # the GPU's path on a CPU, eagerly
    assert static.enabled_by_default(torch.device("cpu"))
    fixed = Runner(tiny_llama, static=True, how="graph")
    assert fixed.static is not None and fixed.static.how == "eager"  # no graphs on a CPU
    with pytest.raises(ValueError):
        Runner(tiny_llama, static=True, how="graphs")


def test_a_rotary_embedding_that_reads_positions_on_the_host_is_refused(tiny_llama):
    runner = Runner(tiny_llama, static=True)
    runner.rotary.rope_type = "dynamic"
    assert "host" in (static.unsupported(runner, "graph") or "")


def test_a_capture_that_fails_is_one_warning_and_the_runner_runs_eagerly(pair, monkeypatch, capsys):
    """A driver or torch release that refuses to record the step costs speed, not the
    run: one warning, then every call in the eager layers, the same tokens."""
    eager, fixed = pair
    assert fixed.static is not None
    fixed.static.recorder.how = "graph"  # as on a GPU

    def refuse(buffer):
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing\nmore")

    monkeypatch.setattr(fixed.static.recorder, "_graph", refuse)
    for runner in (eager, fixed):
        runner.tokens = decode_plain(runner, PROMPT, 40).tokens  # type: ignore[attr-defined]
    assert fixed.tokens == eager.tokens  # type: ignore[attr-defined]
    assert fixed.static.failed is not None and "not permitted" in fixed.static.failed
    assert sum(fixed.static.calls.values()) == 0
    said = " ".join(capsys.readouterr().err.split())  # the console folds long lines
    assert said.count("warning:") == 1 and "the engine runs eagerly" in said
