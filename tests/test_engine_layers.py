"""The engine's layer arithmetic: a prepared rotation and fused projections give what the
plain forms give, and fusing costs no memory."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

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


def test_the_norm_takes_the_fused_kernel_in_float32_and_in_half_precision_off_the_cpu():
    assert layers.fused_norm_applies(torch.zeros(2, device="meta"))
    assert layers.fused_norm_applies(torch.zeros(2, dtype=torch.bfloat16, device="meta"))
    assert not layers.fused_norm_applies(torch.zeros(2, dtype=torch.bfloat16))  # the module


def test_the_fused_norm_in_half_precision_is_the_modules_within_its_rounding(tiny_llama):
    """The fused kernel rounds once where the module rounds twice: in bfloat16 their
    values are a rounding apart at most (this runs the kernel on the CPU, its formula the
    same there)."""
    norm = tiny_llama.model.layers[0].input_layernorm.to(torch.bfloat16)
    norm.weight.data = torch.randn_like(norm.weight).abs() + 0.5
    x = torch.randn(3, 7, tiny_llama.config.hidden_size, dtype=torch.bfloat16) * 4
    fused = torch.nn.functional.rms_norm(x, (x.shape[-1],), norm.weight, norm.variance_epsilon)
    module = norm(x)
    assert fused.dtype == module.dtype == torch.bfloat16
    eps = torch.finfo(torch.bfloat16).eps
    assert ((fused.float() - module.float()).abs() <= 2 * eps * module.float().abs()).all()
    assert layers.rms_norm(norm, x).equal(module)  # on the CPU: the module's values


def test_off_the_cpu_the_rotation_adds_its_second_product_in_one_operation(tiny_llama, monkeypatch):
    """Off the CPU the rotation is three operations, its second product rounded inside
    the sum (``addcmul``): within a rounding of the textbook values; on the CPU their bits."""
    assert layers.fused_rotation_applies(torch.zeros(2, dtype=torch.bfloat16, device="meta"))
    assert not layers.fused_rotation_applies(torch.zeros(2))
    head_dim = tiny_llama.config.hidden_size // tiny_llama.config.num_attention_heads
    x = torch.randn(1, 3, 5, head_dim, dtype=torch.bfloat16) * 4
    rope = tiny_llama.model.rotary_emb(x, torch.arange(7, 12).view(1, 5))
    rotation = layers.Rotation(rope)
    on_cpu = rotation(x)
    monkeypatch.setattr(layers, "fused_rotation_applies", lambda x: True)
    with TorchOperations() as counted:
        fused = rotation(x)
    assert counted.names == ["aten.mul.Tensor", "aten.roll.default", "aten.addcmul.default"]
    # a rounding of each term at most (the sum may cancel, so not of the result)
    terms = (x.float() * rotation.cos.float()).abs() + (
        x.float().roll(rotation.half, dims=-1) * rotation.sin.float()
    ).abs()
    eps = torch.finfo(torch.bfloat16).eps
    assert ((fused.float() - on_cpu.float()).abs() <= 2 * eps * terms).all()
    assert not fused.equal(on_cpu)  # it did round otherwise somewhere


class TorchOperations(TorchDispatchMode):
    """The torch operations dispatched inside it, by name."""

    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))
