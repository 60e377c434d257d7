"""The engine's layer arithmetic: a prepared rotation and fused projections give what the
plain forms give, and fusing costs no memory."""

from __future__ import annotations

import torch

from autotune.engine import layers
from autotune.engine.runner import Runner


def test_a_prepared_rotation_gives_the_textbook_ropes_bits(tiny_llama):
    rotary = tiny_llama.model.rotary_emb
    x = torch.randn(1, 3, 5, tiny_llama.config.hidden_size // tiny_llama.config.num_attention_heads)
    rope = rotary(x, torch.arange(7, 12).view(1, 5))
    cos, sin = (t.unsqueeze(1) for t in rope)
    half = x.shape[-1] // 2
    textbook = x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin
    assert torch.equal(layers.Rotation(rope)(x), textbook)


def test_fused_projections_share_the_modules_weights(tiny_llama):
    attention = tiny_llama.model.layers[0].self_attn
    before = [m.weight.detach().clone() for m in (attention.q_proj, attention.k_proj)]
    fused = layers.Fused.of([attention.q_proj, attention.k_proj])
    assert layers.Fused.of([attention.q_proj, attention.k_proj]) is fused  # made once
    storage = fused.weight.untyped_storage().data_ptr()
    for module, old in zip((attention.q_proj, attention.k_proj), before):
        assert torch.equal(module.weight, old)
        assert module.weight.untyped_storage().data_ptr() == storage  # a view, not a copy
    x = torch.randn(1, 4, tiny_llama.config.hidden_size)
    q, k = fused(x, layers.plain_linear)
    torch.testing.assert_close(q, attention.q_proj(x))
    torch.testing.assert_close(k, attention.k_proj(x))


def test_the_fused_forward_gives_the_unfused_logits(tiny_llama):
    runner = Runner(tiny_llama)
    tokens = torch.tensor([3, 9, 27, 81 % tiny_llama.config.vocab_size])
    fused = runner.forward(tokens, torch.arange(4), runner.new_cache()).logits
    runner.fused = [(None, None)] * runner.num_layers
    separate = runner.forward(tokens, torch.arange(4), runner.new_cache()).logits
    torch.testing.assert_close(fused, separate)
