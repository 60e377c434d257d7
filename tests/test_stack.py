"""The runner's decoder layers in the engine's C++ code (``engine.stack``): the same values
as the Python layers, every token scored with the bits of a one-token step whatever else a
verify pass holds (chains and trees), and the weights moved to huge pages unchanged."""

from __future__ import annotations

import pytest
import torch

from autotune.engine import kernels, native
from autotune.engine.runner import Runner
from autotune.engine.skip import SkipMask
from autotune.engine.tree import TreeShape

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.skipif(not native.available(), reason="no C++ compiler for the engine's code"),
]

PROMPT = [1, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50]


def runners(model) -> tuple[Runner, Runner]:
    native_runner = Runner(model)
    assert native_runner.stack is not None
    python_runner = Runner(model, native=False)
    assert python_runner.stack is None
    return native_runner, python_runner


def test_the_native_layers_compute_what_the_python_layers_do(tiny_llama):
    ours, theirs = runners(tiny_llama)
    tokens, positions = torch.tensor(PROMPT), torch.arange(len(PROMPT))
    tree = TreeShape((-1, -1, 0, 0, 2))
    cases = [
        ("causal", {}),
        ("skipped sublayers", {"skip": SkipMask.of(attention=[1, 3], mlp=[0, 2])}),
    ]
    for name, options in cases:
        a = ours.forward(tokens, positions, ours.new_cache(), **options)
        b = theirs.forward(tokens, positions, theirs.new_cache(), **options)
        torch.testing.assert_close(a.logits, b.logits, atol=1e-5, rtol=1e-5, msg=name)
        torch.testing.assert_close(a.hidden, b.hidden, atol=1e-5, rtol=1e-5, msg=name)
    # after a cached prefix: a tree mask over the new tokens, and the same over all columns
    caches = {}
    for runner in (ours, theirs):
        caches[runner] = runner.new_cache()
        runner.forward(tokens, positions, caches[runner])
    ids = torch.tensor([7, 8, 9, 10, 11, 12])
    offsets = len(PROMPT) + tree.position_offsets("cpu")
    mask = tree.attention_mask("cpu")
    whole = torch.cat([torch.ones(len(ids), len(PROMPT), dtype=torch.bool), mask], dim=1)
    for tree_mask in (mask, whole):
        outs = []
        for runner in (ours, theirs):
            caches[runner].crop(len(PROMPT))
            outs.append(runner.forward(ids, offsets, caches[runner], mask=tree_mask).logits)
        torch.testing.assert_close(outs[0], outs[1], atol=1e-5, rtol=1e-5)
    assert caches[ours].lengths == caches[theirs].lengths


def test_a_verified_token_gets_the_bits_of_a_one_token_step(tiny_llama, small_kernel_everywhere):
    """What keeps speculative greedy output identical to plain greedy output: the logits of
    a token on a tree's path (its rejected siblings between its ancestors) are exactly those
    a one-token step gives it after the same tokens."""
    runner = Runner(tiny_llama)
    prefix = torch.tensor(PROMPT)
    # root, then nodes: 0 (depth 1), 1 (depth 1, a sibling), 2 under 0, 3 under 1, 4 under 2
    tree = TreeShape((-1, -1, 0, 1, 2))
    ids = torch.tensor([60, 61, 62, 63, 64, 65])  # the root's token, then the nodes'
    cache = runner.new_cache()
    runner.forward(prefix, torch.arange(len(prefix)), cache)
    start = len(prefix)
    verify = runner.forward(
        ids,
        start + tree.position_offsets("cpu"),
        cache,
        mask=tree.attention_mask("cpu"),
    ).logits
    # the path root -> node 0 -> node 2 -> node 4, one token at a time
    cache.crop(start)
    for step, row in enumerate([0, 1, 3, 5]):
        single = runner.forward(ids[row : row + 1], torch.tensor([start + step]), cache).logits
        assert torch.equal(single[0], verify[row]), (step, row)
    # and a chain verified at once against the same chain one token at a time
    cache.crop(start)
    chain = runner.forward(ids, torch.arange(start, start + len(ids)), cache).logits
    cache.crop(start)
    for i in range(len(ids)):
        single = runner.forward(ids[i : i + 1], torch.tensor([start + i]), cache).logits
        assert torch.equal(single[0], chain[i]), i


def test_weights_move_to_huge_pages_once_with_their_values(tiny_llama):
    before = {name: p.detach().clone() for name, p in tiny_llama.named_parameters()}
    first = Runner(tiny_llama)
    moved = {name: p.data_ptr() for name, p in tiny_llama.named_parameters()}
    Runner(tiny_llama)  # a second runner over the same model copies nothing again
    assert {name: p.data_ptr() for name, p in tiny_llama.named_parameters()} == moved
    for name, p in tiny_llama.named_parameters():
        assert torch.equal(p.detach(), before[name]), name
    # fused weights and the modules' own share memory still
    qkv = first.fused[0][0]
    assert qkv.weight.data_ptr() == first.layers[0].self_attn.q_proj.weight.data_ptr()


def test_without_the_engines_code_the_python_layers_run(tiny_llama, monkeypatch):
    monkeypatch.setattr(native, "_module", None)
    monkeypatch.setattr(native, "_tried", False)
    monkeypatch.setenv(native.SWITCH_ENV, "0")
    # the process's kernel tables remember choices by weight id, and a freed weight's id
    # is reused: a choice of the C++ product made while it was loaded must not carry over
    monkeypatch.setattr(kernels, "_TABLES", {})
    runner = Runner(tiny_llama)
    assert runner.stack is None
    out = runner.forward(torch.tensor(PROMPT), torch.arange(len(PROMPT)), runner.new_cache())
    with torch.no_grad():
        expected = tiny_llama(torch.tensor([PROMPT])).logits[0]
    torch.testing.assert_close(out.logits, expected, atol=1e-4, rtol=1e-4)
