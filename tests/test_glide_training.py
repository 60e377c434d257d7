"""GLIDE draft training (`autotune heads train --kind glide`): its batches (labels in the
answer only, the block mask, padding), the warm start, training on the tiny random LLaMA
(whose greedy answers fall into short loops: a pattern a draft can learn), the held-back
report, and the saved folder."""

from __future__ import annotations

import json

import pytest
import torch

from autotune.engine.runner import Runner
from autotune.errors import AutotuneError
from autotune.heads.glide import block_limits, load_glide_draft, stale_visibility
from autotune.training.distill import answer_prompts
from autotune.training.glide import (
    BETAS,
    Batch,
    GlideOptions,
    GlideTrainer,
    examples,
    glide_accuracy,
    glide_loss,
    new_draft,
    train_glide,
    train_glide_draft,
)
from autotune.training.job import HeadsJob, default_options, run_heads_train, trained_on
from autotune.training.loss import IGNORE

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = [
    "Tell me a story.",
    "What is 2+2?",
    "Name a color.",
    "Write a poem about rain.",
    "Why is the sky blue?",
    "Give me a recipe.",
    "Describe a cat.",
    "How do planes fly?",
]


def options(**changes) -> GlideOptions:
    return GlideOptions(**{"loss_dtype": "float32", "time_budget_s": None, **changes})


@pytest.fixture
def tiny_data(tiny_target):
    """(train, held-back) sequences: the tiny model's answers to 6 + 2 prompts."""
    prompts = [tiny_target.encode_chat(t) for t in PROMPTS]
    train, held = answer_prompts(tiny_target, prompts[:6], prompts[6:], 40, 4)
    as_sequences = lambda pairs: [(p + a.tokens, len(p)) for p, a in pairs]  # noqa: E731
    return as_sequences(train), as_sequences(held)


def test_batch_labels_mask_and_padding(tiny_llama):
    draft = new_draft(tiny_llama, 1, "random")
    runner = Runner(tiny_llama)
    items = examples(runner, draft, [([1, 5, 6, 7, 8, 9], 3), ([1, 5, 6, 7], 2)])
    assert [e.counted for e in items] == [3, 2]
    batch = Batch.of(items, block=3, shifts=[0, 1])
    # row i learns token i + 1 where that token is in the answer
    assert batch.labels.tolist() == [
        [IGNORE, IGNORE, 7, 8, 9, IGNORE],
        [IGNORE, 6, 7, IGNORE, IGNORE, IGNORE],
    ]
    assert batch.tokens[1].tolist() == [1, 5, 6, 7, 0, 0]
    keys = batch.target_kv[0][0]
    assert keys.shape[:3] == (2, tiny_llama.config.num_key_value_heads, 6)
    torch.testing.assert_close(keys[1, :, :4], items[1].keys[0])
    assert (keys[1, :, 4:] == 0).all()
    assert torch.equal(batch.cross_mask[0, 0], stale_visibility(block_limits(6, 3, 0), 6))
    assert torch.equal(batch.cross_mask[1, 0], stale_visibility(block_limits(6, 3, 1), 6))
    # no real row sees a padded position of the target's cache
    assert not batch.cross_mask[1, 0, :4, 4:].any()


def test_target_kv_is_the_runners_cache_of_the_read_layer(tiny_llama):
    draft = new_draft(tiny_llama, 1, "random")
    runner = Runner(tiny_llama)
    tokens = [1, 5, 6, 7, 8]
    (item,) = examples(runner, draft, [(tokens, 2)])
    cache = runner.new_cache()
    with torch.inference_mode():
        runner.forward(torch.tensor(tokens), torch.arange(5), cache)
    last = tiny_llama.config.num_hidden_layers - 1
    assert draft.target_layers == (last,)
    torch.testing.assert_close(item.keys[0], cache.keys[last][0, :, :5])
    torch.testing.assert_close(item.values[0], cache.values[last][0, :, :5])


def test_warm_start_copies_the_targets_weights(tiny_llama):
    draft = new_draft(tiny_llama, 2, "target")
    target = tiny_llama.model
    first, read = draft.layers[0], target.layers[draft.target_layers[0]]
    assert torch.equal(first.self_attn.q_proj.weight, target.layers[0].self_attn.q_proj.weight)
    assert torch.equal(first.cross_attn.q_proj.weight, read.self_attn.q_proj.weight)
    assert torch.equal(first.cross_attn.o_proj.weight, read.self_attn.o_proj.weight)
    assert torch.equal(first.cross_norm.weight, read.input_layernorm.weight)
    assert torch.equal(first.mlp.down_proj.weight, read.mlp.down_proj.weight)
    assert torch.equal(draft.norm.weight, target.norm.weight)
    assert (
        draft.layers[0].cross_attn.q_proj.weight.data_ptr()
        != read.self_attn.q_proj.weight.data_ptr()
    )


def test_loss_counts_only_answer_rows(tiny_llama):
    draft = new_draft(tiny_llama, 1, "random")
    runner = Runner(tiny_llama)
    weight = tiny_llama.lm_head.weight.detach()
    items = examples(runner, draft, [([1, 5, 6, 7, 8, 9], 4)])
    batch = Batch.of(items, block=5, shifts=[0])
    loss = glide_loss(draft, tiny_llama.model.embed_tokens, weight, batch)
    with torch.no_grad():
        hidden = draft(
            tiny_llama.model.embed_tokens(batch.tokens),
            torch.arange(6)[None],
            batch.target_kv,
            batch.cross_mask,
        )[0]
        logits = hidden @ weight.T
    expected = torch.nn.functional.cross_entropy(logits[3:5], torch.tensor([8, 9]))
    torch.testing.assert_close(loss.detach(), expected, atol=1e-5, rtol=1e-5)


def test_training_lowers_the_loss_and_raises_held_back_accuracy(tiny_llama, tiny_data):
    train, held = tiny_data
    runner = Runner(tiny_llama)
    untrained = glide_accuracy(new_draft(tiny_llama, 1, "random"), runner, held, depth=4)
    draft = new_draft(tiny_llama, 1, "random")
    stats = train_glide_draft(draft, runner, train, options(epochs=30, lr=3e-3))
    assert stats.steps == 30 * 2 and not stats.stopped_by_time
    assert sum(stats.losses[-5:]) < 0.85 * sum(stats.losses[:5])
    trained = glide_accuracy(draft, runner, held, depth=4)
    assert [row.step for row in trained] == [1, 2, 3, 4]
    assert [row.offset for row in trained] == [1, 2, 3, 4]
    mean = lambda rows: sum(r.top1 for r in rows) / len(rows)  # noqa: E731
    assert mean(trained) >= mean(untrained) + 0.3, (untrained, trained)
    for row in trained:
        assert 0.0 <= row.top1 <= row.top5 <= 1.0
    # 2 answers of 40 tokens: step k has a true token from 40 - k roots each
    assert [row.positions for row in trained] == [2 * (40 - k) for k in range(1, 5)]
    assert not any(p.requires_grad for p in draft.parameters())


def test_the_optimizer_takes_the_references_betas(tiny_llama, tiny_data, monkeypatch):
    seen = []
    real = torch.optim.AdamW

    def spy(params, **kwargs):
        optimizer = real(params, **kwargs)
        seen.extend(group["betas"] for group in optimizer.param_groups)
        return optimizer

    monkeypatch.setattr(torch.optim, "AdamW", spy)
    train_glide_draft(
        new_draft(tiny_llama, 1), Runner(tiny_llama), tiny_data[0][:2], options(epochs=1)
    )
    assert seen == [BETAS] == [(0.9, 0.95)]


def test_training_stops_at_its_time_limit(tiny_llama, tiny_data):
    stats = train_glide_draft(
        new_draft(tiny_llama, 1),
        Runner(tiny_llama),
        tiny_data[0],
        options(epochs=10_000, sequences_per_step=1),
        seconds=0.5,
    )
    assert stats.stopped_by_time and 0 < stats.epochs < 10_000


def test_answers_too_short_to_train_on(tiny_llama):
    with pytest.raises(AutotuneError, match="too short"):
        train_glide_draft(new_draft(tiny_llama, 1), Runner(tiny_llama), [([1, 5], 2)], options())


def test_bad_options():
    with pytest.raises(AutotuneError, match="init 'zeros'"):
        GlideOptions(init="zeros")
    with pytest.raises(AutotuneError, match="at least one layer"):
        GlideOptions(layers=0)
    assert isinstance(default_options("glide"), GlideOptions)


def test_train_glide_reports_and_saves_a_folder_that_loads_to_the_same_draft(tiny_target, tmp_path):
    prompts = [tiny_target.encode_chat(t) for t in PROMPTS]
    result = train_glide(
        tiny_target, prompts[:6], prompts[6:], options(max_new_tokens=16, epochs=2, depth=3)
    )
    assert result.held_back_tokens == 2 * 16 and result.train_tokens == 6 * 16
    assert [a.positions for a in result.accuracy] == [2 * 15, 2 * 14, 2 * 13]
    assert len(result.trained.layers) == 1  # one layer on a CPU
    folder = result.save(tmp_path / "d", tiny_target, "tiny", {"autotune": {"kind": "glide"}})
    assert (folder / "draft_vocab.json").is_file()
    loaded = load_glide_draft(folder, tiny_target.model.config)
    for (name, a), (_, b) in zip(result.trained.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name


def test_heads_job_writes_the_record(tmp_path, tiny_llama_dir):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        "".join(json.dumps({"prompt": t, "id": f"p{i}"}) + "\n" for i, t in enumerate(PROMPTS))
    )
    job = HeadsJob(
        kind="glide",
        model=str(tiny_llama_dir),
        prompts=str(prompts),
        out=tmp_path / "draft",
        options=options(max_new_tokens=12, epochs=1, layers=2),
    )
    result, folder = run_heads_train(job)
    record = json.loads((folder / "config.json").read_text())["autotune"]
    assert record["trained_by"] == "autotune heads train --kind glide"
    assert record["draft"] == {"layers": 2, "target_layers": [2, 3]}
    assert record["options"]["block"] == 5 and record["options"]["lr"] == 5e-4
    assert [row["step"] for row in record["accuracy_held_back"]] == [1, 2, 3, 4, 5]
    assert trained_on(folder, prompts) == set(record["prompts"]["trained_on"])
    assert isinstance(result.trainer, GlideTrainer)


def test_the_draft_trains_over_the_runs_own_runner(tiny_target):
    """A profile's runner is the one GLIDE reads the target's cache through: on a GPU a
    second one would record its steps and lay out its cache again."""
    runner = Runner(tiny_target.model)
    assert GlideTrainer().view(tiny_target, runner) is runner
    assert isinstance(GlideTrainer().view(tiny_target), Runner)
