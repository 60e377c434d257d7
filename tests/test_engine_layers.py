"""The engine's layer arithmetic: a prepared rotation and fused projections give what the
plain forms give, and fusing costs no memory."""

from __future__ import annotations

import pytest
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


@pytest.mark.parametrize("static", [False, True])
def test_with_fused_products_off_the_layers_multiply_module_by_module(tiny_llama, static):
    """The rule the GPU check turns off to time the modules' own products
    (``fused_products_applies``): each layer then makes five products where it made two
    (q, k, v and gate, up), in the eager layers and the fixed-shape step alike, with the
    same logits."""
    tokens = torch.tensor([3, 9, 27, 81 % tiny_llama.config.vocab_size])

    def products(answer: bool) -> tuple[int, torch.Tensor]:
        # torch's own products, counted as they dispatch (the CPU's own kernels do not)
        runner = Runner(tiny_llama, layers.plain_linear, native=False, static=static)
        with layers.forms_answered({"fused_products_applies": lambda x: answer}):
            cache = runner.new_cache()
            with TorchOperations() as counted, torch.inference_mode():
                out = runner.forward(tokens, torch.arange(4), cache)
        if static:
            assert runner.static is not None and runner.static.calls  # the step ran it
        made = counted.names.count("aten.linear.default")
        return made, out.logits

    fused, separate = products(True), products(False)
    assert separate[0] - fused[0] == 3 * tiny_llama.config.num_hidden_layers
    torch.testing.assert_close(separate[1], fused[1])


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


def test_off_the_cpu_the_rotation_is_one_product_with_each_positions_matrix(
    tiny_llama, monkeypatch
):
    """Off the CPU a step's queries and keys are rotated by one batched product with each
    position's matrix (made once a forward), each value's two terms summed before it is
    rounded: within a rounding of the textbook values; a longer prefill rotates in three
    operations (``addcmul``); on the CPU the textbook bits."""
    assert layers.fused_rotation_applies(torch.zeros(2, dtype=torch.bfloat16, device="meta"))
    assert not layers.fused_rotation_applies(torch.zeros(2))
    heads = tiny_llama.config.num_attention_heads
    head_dim = tiny_llama.config.hidden_size // heads
    eps = torch.finfo(torch.bfloat16).eps
    elementwise = ["aten.mul.Tensor", "aten.roll.default", "aten.addcmul.default"]
    for positions, operations in ((5, ["aten.bmm.default"]), (70, elementwise)):
        # as a projection leaves them: [B, S, heads * D], seen as [B, heads, S, D]
        x = layers.heads_of(torch.randn(1, positions, heads * head_dim) * 4, head_dim)
        x = x.to(torch.bfloat16)
        rope = tiny_llama.model.rotary_emb(x, torch.arange(7, 7 + positions).view(1, -1))
        rotation = layers.Rotation(rope)
        on_cpu = rotation(x)
        with monkeypatch.context() as patch:
            patch.setattr(layers, "fused_rotation_applies", lambda x: True)
            rotation.matrix()  # made once a forward, for all its layers
            with TorchOperations() as counted:
                fused = rotation(x)
        # the rest are views: the product reads the projection's layout as it is
        assert [n for n in counted.names if n in [*elementwise, "aten.bmm.default"]] == operations
        assert "aten.copy_.default" not in counted.names and "aten.clone" not in counted.names
        assert fused.shape == on_cpu.shape
        # a rounding of each term at most (the sum may cancel, so not of the result)
        terms = (x.float() * rotation.cos.float()).abs() + (
            x.float().roll(rotation.half, dims=-1) * rotation.sin.float()
        ).abs()
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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_gpus_fused_forms_give_the_layers_values_within_rounding(
    tiny_llama, monkeypatch, dtype
):
    """Each fused form rounds once where the plain forms round twice; the residual is
    added in place, into the step's own running sum, which nothing reads again."""
    model = tiny_llama.to(dtype)
    tokens, positions = torch.tensor([3, 9, 27, 81, 5, 7]), torch.arange(6)

    def forward():
        runner = Runner(model, native=False)
        with torch.inference_mode():
            out = runner.forward(tokens, positions, runner.new_cache())
        return out.logits.float(), out.hidden.float()

    plain = forward()
    for rule in layers.FUSION_RULES:
        monkeypatch.setattr(layers, rule, lambda x: True)
    with TorchOperations() as counted:
        fused = forward()
    assert counted.names.count("aten.addmm_.default") == 2 * model.config.num_hidden_layers
    # the rotation, one product a layer (a composite operation under inference_mode)
    assert counted.names.count("aten.matmul.default") == model.config.num_hidden_layers
    tolerance = 1e-5 if dtype == torch.float32 else 0.05
    for a, b in zip(fused, plain):
        torch.testing.assert_close(a, b, rtol=tolerance, atol=tolerance)
    assert not fused[0].equal(plain[0])  # the fused forms did run


@pytest.mark.usefixtures("gpus_arithmetic", "one_thread")
def test_with_the_gpus_fused_forms_the_step_and_the_layers_decode_alike(tiny_llama, same_greedy):
    """The fixed-shape step (a GPU's replay, run eagerly here) and the eager layers, both
    in the GPU's fused forms: the same greedy tokens, prompt by prompt, and speculative
    decoding in the step the same as plain."""
    from autotune.drafters.engine_lookup import EngineLookupConfig
    from autotune.drafters.ngram import NgramDrafter
    from autotune.engine.decoding import decode_plain, decode_speculative

    eager = Runner(tiny_llama, native=False, static=False)
    fixed = Runner(tiny_llama, native=False, static=True)
    assert fixed.static is not None
    for runner in (eager, fixed):
        runner.eos_token_ids = frozenset()
    for prompt in ([1, 5, 9, 33, 70], [1, 100, 3, 3, 3, 100, 3]):
        expected = decode_plain(eager, prompt, 24).tokens
        same_greedy(fixed, prompt, decode_plain(fixed, prompt, 24).tokens, expected)
        drafted = decode_speculative(
            fixed, NgramDrafter(EngineLookupConfig("vllm", 1, 3, 4)), prompt, 24
        ).tokens
        same_greedy(fixed, prompt, drafted, expected)
    assert sum(fixed.static.calls.values()) > 20


def test_forms_answered_asks_the_rules_otherwise_within_and_puts_them_back():
    """How the benchmarks compare the layers' forms (``layers.forms_answered``): the rules
    named answer as given inside, the others as before, and all are back after, an error
    inside included."""
    before = {rule: getattr(layers, rule) for rule in layers.FUSION_RULES}
    x = torch.zeros(2, device="meta")
    with layers.forms_answered({"fused_norm_applies": lambda t: False}):
        assert layers.fused_norm_applies(x) is False
        assert layers.fused_rotation_applies(x) is True  # off the CPU, as before
    with pytest.raises(RuntimeError), layers.forms_answered({"fused_rotation_applies": bool}):
        raise RuntimeError("a capture refused")
    assert {rule: getattr(layers, rule) for rule in layers.FUSION_RULES} == before
