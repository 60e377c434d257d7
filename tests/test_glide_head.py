"""The GLIDE draft model: its forward against a naive reimplementation written from the
reference's definition, the RoPE it takes from the target, the block mask, and both
checkpoint layouts (ours; the reference's, mapped from a synthetic checkpoint)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from autotune.engine.runner import Runner
from autotune.heads.glide import (
    GlideDraft,
    block_limits,
    default_target_layers,
    load_glide_draft,
    new_glide_draft,
    save_glide_draft,
    stale_visibility,
    teacher_cache,
)
from autotune.heads.medusa import HeadsError
from autotune.models import tiny

pytestmark = pytest.mark.usefixtures("one_thread")

TOKENS = [1, 5, 9, 33, 70, 71, 72, 5, 9, 33, 40, 41]


@pytest.fixture
def target():
    """A tiny LLaMA whose RoPE base is SmolLM2's (100000), not the reference's 10000."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        rope_theta=100000.0,
    )
    return LlamaForCausalLM(config).eval()


def randomised(draft: GlideDraft, seed: int = 1) -> GlideDraft:
    """Norm weights away from one, so that a wrong norm or a missing one shows."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in draft.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=generator))
    return draft.eval()


# --- a naive reimplementation of the reference's draft (glide/glideModel.py) -----------


def rms(x, weight, eps):
    return weight * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def rotate(x, positions, theta):
    """x [heads, S, D] rotated at ``positions`` with RoPE base ``theta``."""
    dim = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, dim, 2).float() / dim)
    angles = positions[:, None].float() * inv[None]
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
    half = torch.cat([-x[..., dim // 2 :], x[..., : dim // 2]], -1)
    return x * cos + half * sin


def attention(q, k, v, allowed):
    """q [h, S, D], k/v [kv, T, D] (repeated per group, as repeat_kv does), allowed [S, T]."""
    k = k.repeat_interleave(q.shape[0] // k.shape[0], 0)
    v = v.repeat_interleave(q.shape[0] // v.shape[0], 0)
    scores = q @ k.transpose(1, 2) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~allowed, float("-inf"))
    return (scores.softmax(-1) @ v).transpose(0, 1).reshape(q.shape[1], -1)


def naive_draft(state, names, shape, embeds, target_cache, target_layers, visible):
    """The draft's final-normed states [S, H] for inputs ``embeds`` [S, H] at positions
    0 .. S - 1, written from the reference's definition: per layer, input norm and causal
    self-attention (the draft's RoPE base), then cross-attention WITHOUT a norm in the
    reference (``cross_norm`` in ours) whose keys/values are the target layer's cache and
    whose query is rotated with the target's base, then post norm and SwiGLU MLP."""
    seq = embeds.shape[0]
    positions = torch.arange(seq)
    x = embeds
    for m, t in enumerate(target_layers):

        def w(name, m=m):
            return state[names(m, name)]

        eps, heads, kv, dim = shape["eps"], shape["heads"], shape["kv_heads"], shape["head_dim"]
        h = rms(x, w("input_layernorm.weight"), eps)
        q = rotate(
            (h @ w("self_attn.q_proj.weight").T).view(seq, heads, dim).transpose(0, 1),
            positions,
            shape["theta"],
        )
        k = rotate(
            (h @ w("self_attn.k_proj.weight").T).view(seq, kv, dim).transpose(0, 1),
            positions,
            shape["theta"],
        )
        v = (h @ w("self_attn.v_proj.weight").T).view(seq, kv, dim).transpose(0, 1)
        causal = torch.ones(seq, seq, dtype=torch.bool).tril()
        x = x + attention(q, k, v, causal) @ w("self_attn.o_proj.weight").T
        h = rms(x, w("cross_norm.weight"), eps) if names(m, "cross_norm.weight") in state else x
        t_heads, t_dim = shape["target_heads"], shape["target_head_dim"]
        q = (h @ w("cross_attn.q_proj.weight").T).view(seq, t_heads, t_dim).transpose(0, 1)
        q = rotate(q, positions, shape["target_theta"])
        keys = target_cache.keys[t][0, :, : target_cache.length(t)]
        values = target_cache.values[t][0, :, : target_cache.length(t)]
        x = x + attention(q, keys, values, visible) @ w("cross_attn.o_proj.weight").T
        h = rms(x, w("post_attention_layernorm.weight"), eps)
        gate, up = h @ w("mlp.gate_proj.weight").T, h @ w("mlp.up_proj.weight").T
        x = x + (F.silu(gate) * up) @ w("mlp.down_proj.weight").T
    return rms(x, state[names(None, "norm.weight")], shape["eps"])


def our_names(m, name):
    return name if m is None else f"layers.{m}.{name}"


def reference_names(m, name):
    return f"model.{name}" if m is None else f"model.layers.{m}.{name}"


def target_shape(model, draft_config, theta) -> dict:
    config = model.config
    return {
        "eps": draft_config.rms_norm_eps,
        "heads": draft_config.num_attention_heads,
        "kv_heads": draft_config.num_key_value_heads,
        "head_dim": draft_config.hidden_size // draft_config.num_attention_heads,
        "theta": theta,
        "target_heads": config.num_attention_heads,
        "target_head_dim": config.hidden_size // config.num_attention_heads,
        "target_theta": 100000.0,
    }


# --- the forward ------------------------------------------------------------------------


@pytest.mark.parametrize("layers", [1, 2])
def test_forward_equals_the_naive_reimplementation(target, layers):
    runner = Runner(target)
    draft = randomised(new_glide_draft(target.config, layers))
    cache = teacher_cache(runner, TOKENS)
    limits = torch.tensor([0, 1, 1, 3, 3, 3, 6, 6, 8, 9, 9, 9])
    visible = stale_visibility(limits, len(TOKENS))
    with torch.no_grad():
        embeds = target.model.embed_tokens(torch.tensor(TOKENS))
        ours = draft(
            embeds[None],
            torch.arange(len(TOKENS))[None],
            draft.read_target(cache, len(TOKENS)),
            visible[None, None],
        )[0]
        naive = naive_draft(
            draft.state_dict(),
            our_names,
            target_shape(target, draft.config, 100000.0),
            embeds,
            cache,
            draft.target_layers,
            visible,
        )
    torch.testing.assert_close(ours, naive, atol=1e-5, rtol=1e-4)


def test_the_cross_query_takes_the_targets_rope_base(target):
    draft = new_glide_draft(target.config, 1)
    dim = target.config.hidden_size // target.config.num_attention_heads
    expected = 1.0 / 100000.0 ** (torch.arange(0, dim, 2).float() / dim)
    torch.testing.assert_close(draft.cross_rotary.inv_freq, expected)
    torch.testing.assert_close(draft.cross_rotary.inv_freq, target.model.rotary_emb.inv_freq)
    # the reference's hard-coded base would rotate it differently
    assert not torch.allclose(
        draft.cross_rotary.inv_freq, 1.0 / 10000.0 ** (torch.arange(0, dim, 2).float() / dim)
    )


def test_draft_layers_read_the_last_target_layers():
    assert default_target_layers(30, 1) == (29,)
    assert default_target_layers(32, 3) == (29, 30, 31)
    assert default_target_layers(2, 4) == (0, 0, 0, 1)


def test_cache_mode_equals_the_batched_forward(target):
    """Drafting with the draft's own KV cache, a row at a time, gives the same states as
    one forward over the sequence: the drafter and the measurement share this."""
    runner = Runner(target)
    draft = randomised(new_glide_draft(target.config, 2))
    cache = teacher_cache(runner, TOKENS)
    kv = draft.read_target(cache, len(TOKENS))
    embeds = target.model.embed_tokens(torch.tensor(TOKENS))[None].detach()
    positions = torch.arange(len(TOKENS))
    visible = stale_visibility(positions, len(TOKENS))
    with torch.no_grad():
        whole = draft(embeds, positions[None], kv, visible[None, None])[0]
        own = draft.new_cache()
        first = draft(embeds[:, :5], positions[None, :5], kv, visible[None, None, :5], own)[0]
        rows = [first]
        for i in range(5, len(TOKENS)):
            rows.append(
                draft(
                    embeds[:, i : i + 1],
                    positions[None, i : i + 1],
                    kv,
                    visible[None, None, i : i + 1],
                    own,
                )[0]
            )
    torch.testing.assert_close(torch.cat(rows), whole, atol=1e-5, rtol=1e-4)


# --- what the draft sees of the target's cache ------------------------------------------


def test_block_mask_sees_the_cache_below_each_blocks_start():
    assert block_limits(12, 5).tolist() == [0, 0, 0, 0, 0, 5, 5, 5, 5, 5, 10, 10]
    assert block_limits(8, 5, shift=2).tolist() == [-2, -2, -2, 3, 3, 3, 3, 3]
    visible = stale_visibility(block_limits(8, 3), 8)
    assert visible[4].tolist() == [True, True, True, False, False, False, False, False]
    assert visible[1].tolist() == [True] + [False] * 7  # a first block sees position 0 only
    assert visible.any(1).all()  # no row sees nothing


def test_block_masked_row_equals_a_draft_reading_the_cache_cut_at_its_block(target):
    """Training's block mask is the inference view: row i with the mask computes what the
    draft computes when the target's cache ends at i's block start."""
    runner = Runner(target)
    draft = randomised(new_glide_draft(target.config, 1))
    cache = teacher_cache(runner, TOKENS)
    n = len(TOKENS)
    embeds = target.model.embed_tokens(torch.tensor(TOKENS))[None].detach()
    limits = block_limits(n, 5, shift=1)
    with torch.no_grad():
        masked = draft(
            embeds,
            torch.arange(n)[None],
            draft.read_target(cache, n),
            stale_visibility(limits, n)[None, None],
        )[0]
        for i in range(n):
            cut = max(int(limits[i]), 1)
            alone = draft(
                embeds[:, : i + 1], torch.arange(i + 1)[None], draft.read_target(cache, cut)
            )[0]
            torch.testing.assert_close(masked[i], alone[-1], atol=1e-5, rtol=1e-4)


# --- our layout -------------------------------------------------------------------------


def test_our_layout_round_trips(tmp_path, target):
    runner = Runner(target)
    draft = randomised(new_glide_draft(target.config, 2))
    folder = save_glide_draft(draft, tmp_path / "d", "tiny", {"autotune": {"x": 1}})
    config = json.loads((folder / "config.json").read_text())
    assert config["glide"]["target_layers"] == [2, 3]
    assert config["glide"]["target"]["rope_theta"] == 100000.0 and config["autotune"] == {"x": 1}
    loaded = load_glide_draft(folder, target.config)
    assert loaded.target_layers == (2, 3) and loaded.embed_tokens is None
    cache = teacher_cache(runner, TOKENS)
    embeds = target.model.embed_tokens(torch.tensor(TOKENS))[None].detach()
    with torch.no_grad():
        args = (embeds, torch.arange(len(TOKENS))[None], draft.read_target(cache, len(TOKENS)))
        torch.testing.assert_close(loaded(*args), draft(*args))


def test_a_draft_made_for_another_target_is_refused(tmp_path, target):
    folder = save_glide_draft(new_glide_draft(target.config, 1), tmp_path / "d", "tiny")
    other = tiny.tiny_llama().config  # same shapes, RoPE base 10000
    with pytest.raises(HeadsError, match=r"rope_theta 100000\.0.*this one has rope_theta 10000\.0"):
        load_glide_draft(folder, other)
    wider = tiny.tiny_llama(layers=2).config
    with pytest.raises(HeadsError, match="reads target layer 3; the model has 2"):
        load_glide_draft(folder, wider)


def test_missing_folders_and_weights_are_one_line_errors(tmp_path, target):
    with pytest.raises(HeadsError, match="not found"):
        load_glide_draft(tmp_path / "nowhere", target.config)
    (tmp_path / "empty").mkdir()
    with pytest.raises(HeadsError, match=r"no config\.json"):
        load_glide_draft(tmp_path / "empty", target.config)
    (tmp_path / "empty" / "config.json").write_text("{}")
    with pytest.raises(HeadsError, match="train one with `autotune heads train --kind glide`"):
        load_glide_draft(tmp_path / "empty", target.config)


# --- the reference's layout -------------------------------------------------------------

SMALL = {"hidden_size": 32, "intermediate_size": 48, "num_attention_heads": 2, "layers": 2}


def reference_checkpoint(folder: Path, target, weights: str = "pytorch_model.bin", **extra):
    """A synthetic smallLlamaForCausalLM checkpoint as the reference's save_pretrained
    writes it: its config (smallLlamaConfig's keys) and its state dict's names."""
    torch.manual_seed(3)
    hidden, inter, heads = (
        SMALL["hidden_size"],
        SMALL["intermediate_size"],
        SMALL["num_attention_heads"],
    )
    t = target.config
    t_dim = t.hidden_size // t.num_attention_heads
    state = {
        "model.embed_tokens.weight": torch.randn(t.vocab_size, hidden),
        "model.norm.weight": 1 + 0.3 * torch.randn(hidden),
        "lm_head.weight": torch.randn(t.vocab_size, hidden) / hidden**0.5,
    }
    for m in range(SMALL["layers"]):
        p = f"model.layers.{m}."
        for name, shape in {
            "input_layernorm.weight": (hidden,),
            "post_attention_layernorm.weight": (hidden,),
            "self_attn.q_proj.weight": (hidden, hidden),
            "self_attn.k_proj.weight": (hidden, hidden),
            "self_attn.v_proj.weight": (hidden, hidden),
            "self_attn.o_proj.weight": (hidden, hidden),
            "cross_attn.q_proj.weight": (t.num_attention_heads * t_dim, hidden),
            "cross_attn.o_proj.weight": (hidden, t.num_attention_heads * t_dim),
            "mlp.gate_proj.weight": (inter, hidden),
            "mlp.up_proj.weight": (inter, hidden),
            "mlp.down_proj.weight": (hidden, inter),
        }.items():
            base = 1.0 if name.endswith("norm.weight") else 0.0
            state[p + name] = base + torch.randn(shape) / (shape[-1] ** 0.5)
    state.update(extra)
    folder.mkdir(parents=True, exist_ok=True)
    if weights.endswith(".safetensors"):
        from safetensors.torch import save_file

        save_file(state, str(folder / weights))
    else:
        torch.save(state, folder / weights)
    config = {
        "architectures": ["smallLlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": t.vocab_size,
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": SMALL["layers"],
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "hidden_act": "silu",
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "block_size": 5,
        "large_hidden_size": t.hidden_size,
        "large_head_dim": t_dim,
        "large_num_attention_heads": t.num_attention_heads,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "use_remap": False,
    }
    (folder / "config.json").write_text(json.dumps(config))
    return state


@pytest.mark.parametrize("weights", ["pytorch_model.bin", "model.safetensors"])
def test_reference_checkpoint_maps_to_the_reference_computation(tmp_path, target, weights):
    state = reference_checkpoint(tmp_path / "ref", target, weights)
    draft = load_glide_draft(tmp_path / "ref", target.config)
    # the reference's rule: its 2 layers read the target's last 2; no cross-attention norm
    assert draft.target_layers == (2, 3) and not draft.spec.cross_norm
    runner = Runner(target)
    embed, lm_head = draft.vocabulary(runner)
    assert embed is draft.embed_tokens and lm_head is draft.lm_head
    cache = teacher_cache(runner, TOKENS)
    n = len(TOKENS)
    visible = stale_visibility(torch.arange(n), n)
    with torch.no_grad():
        ours = lm_head(
            draft(
                embed(torch.tensor([TOKENS])),
                torch.arange(n)[None],
                draft.read_target(cache, n),
                visible[None, None],
            )[0]
        )
        shape = target_shape(target, draft.config, 10000.0)
        naive = (
            naive_draft(
                state,
                reference_names,
                shape,
                state["model.embed_tokens.weight"][TOKENS],
                cache,
                (2, 3),
                visible,
            )
            @ state["lm_head.weight"].T
        )
    torch.testing.assert_close(ours, naive, atol=1e-4, rtol=1e-4)
    # the cross query is rotated with the target's base though the reference's config
    # (and its code) say 10000; its self-attention keeps the draft's own 10000
    torch.testing.assert_close(draft.cross_rotary.inv_freq, target.model.rotary_emb.inv_freq)
    assert draft.rotary.inv_freq[1] > target.model.rotary_emb.inv_freq[1]


def test_reference_checkpoint_decodes_losslessly(tmp_path, target):
    from autotune.drafters.glide import GlideDrafter
    from autotune.drafters.self_spec import DraftExitPolicy
    from autotune.engine.decoding import decode_plain, decode_speculative

    reference_checkpoint(tmp_path / "ref", target)
    draft = load_glide_draft(tmp_path / "ref", target.config)
    runner = Runner(target)
    drafter = GlideDrafter(draft, DraftExitPolicy(4, 0.0, None))
    for prompt in ([1, 5, 9], [1]):
        assert (
            decode_speculative(runner, drafter, prompt, 20).tokens
            == decode_plain(runner, prompt, 20).tokens
        )


def test_reference_checkpoints_that_do_not_fit_are_refused(tmp_path, target):
    reference_checkpoint(
        tmp_path / "remap",
        target,
        **{"model.layers.0.cross_attn.remap_k.weight": torch.zeros(16, 16)},
    )
    with pytest.raises(HeadsError, match="ColossalAI's GLIDE variant"):
        load_glide_draft(tmp_path / "remap", target.config)
    reference_checkpoint(tmp_path / "ref", target)
    from transformers import LlamaConfig

    other = LlamaConfig(
        vocab_size=128,
        hidden_size=96,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    with pytest.raises(
        HeadsError,
        match=r"q_proj\.weight is \[64, 32\]; reading this model's cache needs \[96, 32\]",
    ):
        load_glide_draft(tmp_path / "ref", other)
    bigger_vocab = LlamaConfig(
        vocab_size=200,
        hidden_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    with pytest.raises(HeadsError, match="vocabulary of 128 tokens, the model 200"):
        load_glide_draft(tmp_path / "ref", bigger_vocab)
