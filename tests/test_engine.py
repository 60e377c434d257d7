"""The runner, KV cache, plain and speculative decoding, and the layer-skip drafter."""

from __future__ import annotations

import pytest
import torch

from autotune.drafters.self_spec import AdaptiveExit, DraftExitPolicy, LayerSkipDrafter
from autotune.engine.decoding import decode_plain, decode_speculative
from autotune.engine.kvcache import KVCache
from autotune.engine.runner import Runner
from autotune.engine.skip import NO_SKIP, SkipMask

pytestmark = pytest.mark.usefixtures("one_thread")


PROMPTS = [
    [1, 5, 9, 33, 70],
    [1, 100, 3],
    [1, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50],
    [1, 7],
]


def truncate_at_eos(tokens: list[int], eos: set[int]) -> list[int]:
    for i, token in enumerate(tokens):
        if token in eos:
            return tokens[: i + 1]
    return tokens


def hf_greedy(model, prompt: list[int], new_tokens: int) -> list[int]:
    out = model.generate(
        torch.tensor([prompt]),
        max_new_tokens=new_tokens,
        min_new_tokens=0,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )
    return out[0, len(prompt) :].tolist()


def eos_of(model) -> set[int]:
    eos = model.config.eos_token_id
    if eos is None:
        return set()
    return set(eos) if isinstance(eos, (list, tuple)) else {eos}


# --- plain decoding ------------------------------------------------------------------


def test_decode_plain_matches_hf_generate(tiny_llama):
    runner = Runner(tiny_llama)
    assert runner.eos_token_ids == frozenset({2})
    for prompt in PROMPTS:
        expected = truncate_at_eos(hf_greedy(tiny_llama, prompt, 40), {2})
        result = decode_plain(runner, prompt, 40)
        assert result.tokens == expected
        assert result.steps == len(result.tokens) - 1  # one forward per token after prefill


def test_decode_plain_stops_at_eos(tiny_llama):
    """Steer the model to emit EOS: the output keeps it and stops there."""
    runner = Runner(tiny_llama)
    prompt = PROMPTS[0]
    free = decode_plain(runner, prompt, 10).tokens
    runner.eos_token_ids = frozenset({free[3]})
    stopped = decode_plain(runner, prompt, 10).tokens
    first = free.index(free[3])
    assert stopped == free[: first + 1]


@pytest.mark.embedded
def test_decode_plain_matches_hf_generate_embedded(embedded_target):
    target = embedded_target
    runner = Runner(target.model)
    eos = eos_of(target.model)
    for text in ["What is the capital of France?", "Write a haiku about the sea."]:
        prompt = target.encode_chat(text)
        expected = truncate_at_eos(hf_greedy(target.model, prompt, 32), eos)
        assert decode_plain(runner, prompt, 32).tokens == expected


# --- speculative decoding ------------------------------------------------------------

MASKS = [
    SkipMask.of(attention=[1, 2]),
    SkipMask.of(mlp=[3]),
    SkipMask.of(attention=[1], mlp=[1, 2]),
    SkipMask.of(attention=[0, 1, 2, 3], mlp=[0, 1, 2, 3]),  # embeddings straight to the head
]
POLICIES = [
    DraftExitPolicy(max_tokens=1, exit_threshold=0.0, adaptive=None),
    DraftExitPolicy(max_tokens=3, exit_threshold=0.0, adaptive=None),
    DraftExitPolicy(max_tokens=3, exit_threshold=0.5, adaptive=AdaptiveExit()),
    DraftExitPolicy(max_tokens=8, exit_threshold=0.0, adaptive=AdaptiveExit(0.5, 0.05, 0.3, 0.5)),
    DraftExitPolicy(max_tokens=8, exit_threshold=0.5, adaptive=None),
]


def check_speculative(runner, drafter, prompt, tokens, plain=None):
    plain = plain if plain is not None else decode_plain(runner, prompt, tokens).tokens
    result = decode_speculative(runner, drafter, prompt, tokens)
    assert result.tokens == plain
    assert result.steps >= 1
    assert result.drafted >= result.steps  # at least one draft token per step
    assert 0 <= result.accepted <= result.drafted
    assert len(result.draft_lengths) == result.steps
    assert sum(result.draft_lengths) == result.drafted
    assert max(result.draft_lengths) <= drafter.policy.max_tokens
    # every step yields its accepted tokens plus one: the counts must add up
    assert len(plain) <= 1 + result.steps + result.accepted
    return result


@pytest.mark.parametrize("mask", MASKS, ids=str)
@pytest.mark.parametrize(
    "policy",
    POLICIES,
    ids=lambda p: f"k{p.max_tokens}-t{p.exit_threshold}-{'adaptive' if p.adaptive else 'static'}",
)
def test_speculative_is_lossless_tiny(tiny_llama, mask, policy):
    runner = Runner(tiny_llama)
    for prompt in PROMPTS:
        check_speculative(runner, LayerSkipDrafter(mask, policy), prompt, 40)


def test_speculative_drafter_is_reused_across_prompts(tiny_llama):
    """One drafter, many sequences (as the timing harness does): reset() between them."""
    runner = Runner(tiny_llama)
    drafter = LayerSkipDrafter(SkipMask.of(attention=[2]), POLICIES[2])
    for prompt in PROMPTS + PROMPTS:
        check_speculative(runner, drafter, prompt, 30)


def test_speculative_high_agreement_accepts_most(tiny_llama):
    """Skipping one MLP of a random model barely changes it: most drafts are accepted,
    so steps are far fewer than tokens (checks acceptance really happens)."""
    runner = Runner(tiny_llama)
    prompt = PROMPTS[0]
    result = check_speculative(
        runner, LayerSkipDrafter(SkipMask.of(mlp=[3]), POLICIES[1]), prompt, 40
    )
    assert result.accepted > 0
    assert result.steps < len(result.tokens) - 1


def test_speculative_budget_is_respected(tiny_llama):
    runner = Runner(tiny_llama)
    drafter = LayerSkipDrafter(SkipMask.of(mlp=[3]), DraftExitPolicy(8, 0.0, None))
    for n in (1, 2, 3, 9):
        result = decode_speculative(runner, drafter, PROMPTS[0], n)
        assert result.tokens == decode_plain(runner, PROMPTS[0], n).tokens
        assert len(result.tokens) == n


@pytest.mark.embedded
def test_speculative_is_lossless_embedded(embedded_target):
    target = embedded_target
    runner = Runner(target.model)
    texts = [
        "What is the capital of France?",
        "Explain photosynthesis in one sentence.",
        "List three prime numbers.",
    ]
    prompts = [target.encode_chat(t) for t in texts]
    plains = [decode_plain(runner, p, 48).tokens for p in prompts]
    configs = [
        (SkipMask.of(attention=range(9, 21)), DraftExitPolicy(4, 0.0, None)),
        (
            SkipMask.of(attention=range(5, 25, 2), mlp=range(10, 20, 3)),
            DraftExitPolicy(8, 0.5, AdaptiveExit()),
        ),
    ]
    for mask, policy in configs:
        accepted = 0
        for prompt, plain in zip(prompts, plains):
            accepted += check_speculative(
                runner, LayerSkipDrafter(mask, policy), prompt, 48, plain
            ).accepted
        assert accepted > 0  # the real model's skipped-layer draft agrees sometimes


# --- drafter and skip mask -----------------------------------------------------------


def test_layer_skip_drafter_refuses_empty_mask():
    with pytest.raises(ValueError):
        LayerSkipDrafter(SkipMask())
    with pytest.raises(ValueError):
        LayerSkipDrafter(NO_SKIP, DraftExitPolicy(3, 0.0, None))


@pytest.mark.parametrize("num_layers", [4, 30])
def test_skip_mask_bits_round_trip(num_layers):
    mask = SkipMask.of(attention=[0, 2, num_layers - 1], mlp=[1, num_layers - 2])
    bits = mask.to_bits(num_layers)
    assert len(bits) == 2 * num_layers
    # attention bits first, then MLP bits at offset L (not a hard-coded offset)
    assert bits[:num_layers] == [int(i in {0, 2, num_layers - 1}) for i in range(num_layers)]
    assert bits[num_layers + 1] == 1 and bits[num_layers + num_layers - 2] == 1
    assert sum(bits[num_layers:]) == 2
    assert SkipMask.from_bits(bits, num_layers) == mask
    # and from arbitrary bits back to bits
    other = [1, 0] * num_layers
    assert SkipMask.from_bits(other, num_layers).to_bits(num_layers) == other
    only_mlp = [0] * num_layers + [1] + [0] * (num_layers - 1)
    assert SkipMask.from_bits(only_mlp, num_layers) == SkipMask.of(mlp=[0])
    with pytest.raises(ValueError):
        SkipMask.from_bits(bits[:-1], num_layers)


def test_skip_mask_ratio_and_dict():
    mask = SkipMask.of(attention=[3, 1], mlp=[2])
    assert mask.size == 3
    assert mask.ratio(4) == pytest.approx(3 / 8)
    assert mask.as_dict() == {"attention": [1, 3], "mlp": [2]}


# --- KV cache ------------------------------------------------------------------------


def filled_cache(length: int, capacity: int = 16, layers: int = 2) -> KVCache:
    cache = KVCache(
        layers, num_kv_heads=2, head_dim=3, dtype=torch.float32, device="cpu", capacity=capacity
    )
    for layer in range(layers):
        key = (
            torch.arange(length, dtype=torch.float32).view(1, 1, length, 1).expand(1, 2, length, 3)
        )
        cache.update(key + 1000 * layer, -(key + 1000 * layer), layer)
    return cache


def positions_of(cache: KVCache, layer: int) -> list[float]:
    n = cache.length(layer)
    return (cache.keys[layer][0, 0, :n, 0] - 1000 * layer).tolist()


def test_kvcache_update_returns_whole_layer_and_crop():
    cache = filled_cache(5)
    keys, values = cache.update(torch.full((1, 2, 2, 3), 7.0), torch.full((1, 2, 2, 3), -7.0), 0)
    assert keys.shape == (1, 2, 7, 3) and values.shape == (1, 2, 7, 3)
    assert keys[0, 0, :, 0].tolist() == [0, 1, 2, 3, 4, 7, 7]
    assert cache.lengths == [7, 5]
    cache.crop(6)
    assert cache.lengths == [6, 5]  # crop never lengthens a layer
    cache.crop(2)
    assert cache.lengths == [2, 2]
    keys, _ = cache.update(torch.full((1, 2, 1, 3), 9.0), torch.zeros(1, 2, 1, 3), 1)
    assert (keys[0, 0, :, 0] - torch.tensor([1000.0, 1001.0, 9.0])).abs().max() == 0
    cache.crop(0)
    assert cache.lengths == [0, 0]


def test_kvcache_grows_past_capacity_and_keeps_contents():
    cache = filled_cache(3, capacity=4)
    assert cache.capacity == 4
    new = torch.arange(3, 10, dtype=torch.float32).view(1, 1, 7, 1).expand(1, 2, 7, 3)
    keys, values = cache.update(new, -new, 0)
    assert cache.length(0) == 10 and keys.shape[2] == 10
    assert cache.keys[0].shape[2] >= 10
    assert keys[0, 1, :, 2].tolist() == list(range(10))
    assert values[0, 0, :, 0].tolist() == [-float(i) for i in range(10)]
    assert cache.length(1) == 3 and positions_of(cache, 1) == [0, 1, 2]


def test_kvcache_keep_compacts_accepted_path():
    cache = filled_cache(10)
    cache.keep(3, torch.tensor([1, 4, 5]))
    for layer in range(2):
        assert cache.length(layer) == 6
        assert positions_of(cache, layer) == [0, 1, 2, 4, 7, 8]
        vals = (-cache.values[layer][0, 1, :6, 2] - 1000 * layer).tolist()
        assert vals == [0, 1, 2, 4, 7, 8]


def test_kvcache_keep_leaves_short_layers_alone():
    cache = filled_cache(10)
    cache.crop(3)
    cache.lengths[1] = 3
    cache.update(torch.full((1, 2, 4, 3), 5.0), torch.zeros(1, 2, 4, 3), 0)  # layer 0: 7
    cache.keep(3, torch.tensor([0, 2]))
    assert cache.lengths == [5, 3]
    assert positions_of(cache, 1) == [0, 1, 2]


def test_runner_works_with_a_cache_that_must_grow(tiny_llama):
    runner = Runner(tiny_llama)
    prompt = torch.tensor(PROMPTS[2])
    small, big = runner.new_cache(capacity=2), runner.new_cache(capacity=64)
    a = runner.forward(prompt, torch.arange(len(prompt)), small).logits
    b = runner.forward(prompt, torch.arange(len(prompt)), big).logits
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert small.length(0) == len(prompt)


# --- runner --------------------------------------------------------------------------


def test_explicit_causal_mask_equals_default(tiny_llama):
    runner = Runner(tiny_llama)
    tokens = torch.tensor(PROMPTS[2])
    s = len(tokens)
    default = runner.forward(tokens, torch.arange(s), runner.new_cache()).logits
    causal = torch.ones(s, s, dtype=torch.bool).tril()
    explicit = runner.forward(tokens, torch.arange(s), runner.new_cache(), mask=causal).logits
    torch.testing.assert_close(explicit, default, atol=1e-5, rtol=1e-5)
    # with a cached prefix, an [S, S] mask and the equivalent [S, P + S] mask agree
    prefix, rest = tokens[:5], tokens[5:]
    n = len(rest)
    c1, c2 = runner.new_cache(), runner.new_cache()
    for c in (c1, c2):
        runner.forward(prefix, torch.arange(5), c)
    short = runner.forward(
        rest, torch.arange(5, s), c1, mask=torch.ones(n, n, dtype=torch.bool).tril()
    ).logits
    full_mask = torch.cat(
        [torch.ones(n, 5, dtype=torch.bool), torch.ones(n, n, dtype=torch.bool).tril()], dim=1
    )
    full = runner.forward(rest, torch.arange(5, s), c2, mask=full_mask).logits
    torch.testing.assert_close(short, default[5:], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(full, default[5:], atol=1e-4, rtol=1e-4)


def test_mask_changes_the_result(tiny_llama):
    """A non-causal mask (here: each token sees only itself) must change the logits,
    so that the mask is really applied."""
    runner = Runner(tiny_llama)
    tokens = torch.tensor(PROMPTS[2])
    s = len(tokens)
    default = runner.forward(tokens, torch.arange(s), runner.new_cache()).logits
    alone = runner.forward(
        tokens, torch.arange(s), runner.new_cache(), mask=torch.eye(s, dtype=torch.bool)
    ).logits
    torch.testing.assert_close(alone[0], default[0], atol=1e-5, rtol=1e-5)
    assert (alone[1:] - default[1:]).abs().max() > 1e-3
    with pytest.raises(ValueError):
        runner.forward(
            tokens, torch.arange(s), runner.new_cache(), mask=torch.ones(s, s + 3, dtype=torch.bool)
        )


def test_batched_forward_equals_single_token_forwards(tiny_llama):
    runner = Runner(tiny_llama)
    tokens = torch.tensor(PROMPTS[2])
    s = len(tokens)
    batched = runner.forward(tokens, torch.arange(s), runner.new_cache())
    cache = runner.new_cache()
    singles = [runner.forward(tokens[i : i + 1], torch.tensor([i]), cache) for i in range(s)]
    torch.testing.assert_close(
        torch.cat([o.logits for o in singles]), batched.logits, atol=1e-4, rtol=1e-4
    )
    torch.testing.assert_close(
        torch.cat([o.hidden for o in singles]), batched.hidden, atol=1e-4, rtol=1e-4
    )
    assert cache.lengths == [s] * runner.num_layers
    last = runner.forward(tokens, torch.arange(s), runner.new_cache(), last_only=True)
    assert last.logits.shape == (1, tiny_llama.config.vocab_size)
    torch.testing.assert_close(last.logits[0], batched.logits[-1], atol=1e-5, rtol=1e-5)


def test_runner_matches_hf_forward(tiny_llama):
    tokens = torch.tensor(PROMPTS[2])
    runner = Runner(tiny_llama)
    ours = runner.forward(tokens, torch.arange(len(tokens)), runner.new_cache()).logits
    with torch.no_grad():
        theirs = tiny_llama(tokens.view(1, -1)).logits[0]
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


def test_skipped_attention_neither_reads_nor_writes_cache(tiny_llama):
    runner = Runner(tiny_llama)
    tokens = torch.tensor(PROMPTS[0])
    cache = runner.new_cache()
    runner.forward(tokens, torch.arange(len(tokens)), cache)
    skip = SkipMask.of(attention=[1, 3], mlp=[0])
    out = runner.forward(torch.tensor([9]), torch.tensor([len(tokens)]), cache, skip=skip)
    n = len(tokens)
    assert cache.lengths == [n + 1, n, n + 1, n]
    # the skipped forward differs from the full one
    cache.crop(n)
    full = runner.forward(torch.tensor([9]), torch.tensor([n]), cache)
    assert (out.logits - full.logits).abs().max() > 1e-4


def test_speculative_stops_at_eos_like_plain(tiny_llama):
    """An EOS inside an accepted draft ends the output there, exactly as plain decoding."""
    runner = Runner(tiny_llama)
    for prompt in PROMPTS:
        free = decode_plain(runner, prompt, 30).tokens
        for eos in {free[5], free[12], free[-1]}:
            runner.eos_token_ids = frozenset({eos})
            plain = decode_plain(runner, prompt, 30).tokens
            assert plain[-1] == eos and plain.count(eos) == 1
            for policy in (POLICIES[1], POLICIES[3]):
                result = decode_speculative(
                    runner, LayerSkipDrafter(SkipMask.of(mlp=[3]), policy), prompt, 30
                )
                assert result.tokens == plain
        runner.eos_token_ids = frozenset({2})


# --- adaptive draft exit -------------------------------------------------------------


def test_adaptive_exit_rule_by_hand():
    """Draft & Verify: AR_e <- b1 AR_e + (1 - b1) AR; gamma~ = gamma + eps if AR_e < alpha,
    else gamma (draft hit the max length) or gamma - eps; gamma <- b2 gamma + (1 - b2) gamma~."""
    from autotune.engine.proposal import VerifyResult

    rule = AdaptiveExit(target_acceptance=0.9, step=0.01, beta1=0.5, beta2=0.9)
    drafter = LayerSkipDrafter(SkipMask.of(mlp=[1]), DraftExitPolicy(4, 0.8, rule))
    assert drafter.threshold == 0.8
    drafter.observe(VerifyResult(4, 1))  # AR_e = 0.5 * 0.9 + 0.5 * 0.25 = 0.575
    assert drafter.threshold == pytest.approx(0.9 * 0.8 + 0.1 * 0.81)
    t = drafter.threshold
    drafter.observe(VerifyResult(4, 4))  # AR_e = 0.7875 < 0.9: still up
    assert drafter.threshold == pytest.approx(0.9 * t + 0.1 * (t + 0.01))
    drafter.observe(VerifyResult(4, 4))  # 0.89375
    drafter.observe(VerifyResult(4, 4))  # 0.946875 >= 0.9, did not hit max: down
    t2 = drafter.threshold
    drafter._hit_max = False
    drafter.observe(VerifyResult(4, 4))
    assert drafter.threshold == pytest.approx(0.9 * t2 + 0.1 * (t2 - 0.01))
    t3 = drafter.threshold
    drafter._hit_max = True  # hit the max length: stays
    drafter.observe(VerifyResult(4, 4))
    assert drafter.threshold == pytest.approx(t3)
    drafter.reset()
    assert drafter.threshold == 0.8


def test_static_policy_never_moves_threshold():
    from autotune.engine.proposal import VerifyResult

    drafter = LayerSkipDrafter(SkipMask.of(mlp=[1]), DraftExitPolicy(4, 0.7, None))
    for accepted in (0, 4, 1):
        drafter.observe(VerifyResult(4, accepted))
    assert drafter.threshold == 0.7


def test_draft_stops_below_threshold_but_proposes_one(tiny_llama):
    """A threshold of 1.0 can never be met: exactly one token per step; threshold 0 with
    max_tokens 5 drafts up to 5."""
    runner = Runner(tiny_llama)
    prompt = PROMPTS[0]
    never = decode_speculative(
        runner, LayerSkipDrafter(SkipMask.of(mlp=[3]), DraftExitPolicy(5, 1.0, None)), prompt, 30
    )
    assert set(never.draft_lengths) == {1}
    always = decode_speculative(
        runner, LayerSkipDrafter(SkipMask.of(mlp=[3]), DraftExitPolicy(5, 0.0, None)), prompt, 30
    )
    assert max(always.draft_lengths) == 5
    assert never.tokens == always.tokens
