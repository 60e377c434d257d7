"""Medusa head training (`autotune heads train`): the data it learns from, the loss, the
accuracy report, the saved folder, and the command's one-line errors. All on the tiny
random LLaMA, whose greedy answers fall into short loops: a pattern heads can learn."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

import autotune.models
from autotune.cli import app
from autotune.heads.medusa import HeadsError, MedusaHeads, load_medusa_heads
from autotune.training.distill import Answer, greedy_answers
from autotune.training.job import trained_on
from autotune.training.loss import IGNORE, TrainingVocab
from autotune.training.medusa import (
    HeadData,
    MedusaOptions,
    head_accuracy,
    heads_loss,
    train_heads,
    train_medusa,
)

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


def encode(target, texts):
    return [target.encode_chat(t) for t in texts]


def tiny_heads(model, count: int) -> MedusaHeads:
    heads = MedusaHeads(model.config.hidden_size, model.config.vocab_size, count)
    heads.share_vocab_projection(model.lm_head.weight)
    return heads


# --- data ----------------------------------------------------------------------------


def test_answers_are_greedy_and_their_hidden_states_match_a_plain_forward(tiny_target):
    model = tiny_target.model
    prompts = encode(tiny_target, ["Hi.", "Write a poem about rain, please.", "What is 2+2?"])
    assert len({len(p) for p in prompts}) == 3  # lanes of three lengths; the states right-padded
    batched = greedy_answers(model, prompts, max_new_tokens=12, batch_size=2)
    single = greedy_answers(model, prompts, max_new_tokens=12, batch_size=1)
    assert [a.tokens for a in batched] == [a.tokens for a in single]
    for prompt, answer in zip(prompts, batched):
        assert 1 <= len(answer.tokens) <= 12
        assert answer.hidden.shape == (len(answer.tokens), model.config.hidden_size)
        with torch.inference_mode():
            # the base head turns hidden row i into token i: the rows are aligned
            assert model.lm_head(answer.hidden).argmax(-1).tolist() == answer.tokens
            full = torch.tensor([prompt + answer.tokens])
            plain = model.model(input_ids=full).last_hidden_state[0]
        start = len(prompt) - 1
        torch.testing.assert_close(
            answer.hidden, plain[start : start + len(answer.tokens)], atol=1e-4, rtol=1e-4
        )


def test_answers_end_at_the_first_eos(tiny_target, monkeypatch):
    model = tiny_target.model
    prompt = encode(tiny_target, ["Tell me a story."])
    first = greedy_answers(model, prompt, max_new_tokens=8)[0].tokens
    model.generation_config.eos_token_id = first[2]  # make the third token end the answer
    model.config.eos_token_id = first[2]
    assert greedy_answers(model, prompt, max_new_tokens=8)[0].tokens == first[:3]


def test_labels_look_k_plus_2_ahead_and_each_head_counts_its_own_positions():
    hidden = torch.arange(5.0)[:, None].repeat(1, 4)  # row i holds the value i
    data = HeadData.from_answers([Answer([10, 11, 12, 13, 14], hidden)], num_heads=3)
    # row i is the state the base head turns into token i; head k predicts token i + k + 1
    assert data.features[:, 0].tolist() == [0, 1, 2, 3]  # the last token's row predicts nothing
    assert data.labels.tolist() == [
        [11, 12, 13],
        [12, 13, 14],
        [13, 14, IGNORE],
        [14, IGNORE, IGNORE],
    ]
    assert data.positions() == [4, 3, 2]
    assert data.tokens == 5


def test_prompt_positions_are_labelled_with_what_the_target_would_write_there(tiny_target):
    model = tiny_target.model
    prompt = encode(tiny_target, ["Write a poem about rain, please."])[0]
    answer = greedy_answers(model, [prompt], max_new_tokens=6, prefill=True)[0]
    data = HeadData.from_answers([answer], num_heads=2, lm_head=model.lm_head.weight)
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([prompt + answer.tokens])).logits[0]
    # index i of the whole sequence: what the target writes after its first i tokens
    written = logits.argmax(-1)[: len(prompt) - 1].tolist() + answer.tokens
    rows = len(prompt) - 1 + len(answer.tokens) - 1
    assert data.labels.tolist() == [
        [written[i + k + 1] if i + k + 1 < len(written) else IGNORE for k in range(2)]
        for i in range(rows)
    ]
    assert written[: len(prompt) - 1] != prompt[1:]  # the labels are not the prompt's text
    # without the lm_head, only the answer's positions, as before
    alone = HeadData.from_answers([answer], num_heads=2)
    assert alone.features.shape[0] == len(answer.tokens) - 1
    assert torch.equal(data.features[-alone.features.shape[0] :], alone.features)


def test_training_vocabulary_is_the_most_frequent_labels():
    labels = torch.tensor([[3, 3, 3], [5, 5, IGNORE], [7, 3, 9]])
    vocab = TrainingVocab.of(labels, vocab_size=10, size=2)
    assert vocab.ids.tolist() == [3, 5]
    assert vocab.map(labels).tolist() == [[0, 0, 0], [1, 1, IGNORE], [IGNORE, 0, IGNORE]]
    weight = torch.arange(10.0)[:, None].repeat(1, 4)
    assert vocab.weight(weight)[:, 0].tolist() == [3, 5]
    whole = TrainingVocab.of(labels, vocab_size=10, size=0)
    assert whole.ids.tolist() == list(range(10)) and torch.equal(whole.map(labels), labels)


def test_heads_trained_over_a_training_vocabulary_learn_as_well(tiny_target):
    """The tiny model's answers loop over a few tokens: a training vocabulary that holds
    them loses nothing, and the heads reach the same accuracy over the whole vocabulary."""
    model = tiny_target.model
    answers = greedy_answers(model, encode(tiny_target, PROMPTS), max_new_tokens=24)
    train, held = HeadData.from_answers(answers[:6], 2), HeadData.from_answers(answers[6:], 2)
    scores = []
    for size in (0, 16):
        torch.manual_seed(0)
        heads = tiny_heads(model, 2)
        options = MedusaOptions(
            num_heads=2, epochs=60, lr=1e-2, loss_dtype="float32", train_vocab=size
        )
        train_heads(heads, train, options)
        scores.append([s.top1 for s in head_accuracy(heads, held)])
    assert scores[1][0] >= 0.5 and scores[1][0] >= scores[0][0] - 0.15, scores


def test_accuracy_divides_each_head_by_its_own_positions():
    # every hidden state points at token 5 and every answer token is 5: all heads are
    # always right, which only holds if head k is divided by its own (smaller) count
    vocab = hidden = 8
    heads = MedusaHeads(hidden, vocab, 3)
    for head in heads.heads:
        torch.nn.init.zeros_(head[0].linear.bias)
    heads.share_vocab_projection(torch.nn.Parameter(torch.eye(vocab) * 10))
    state = F.one_hot(torch.tensor(5), vocab).float()
    answers = [Answer([5] * 6, state.repeat(6, 1)), Answer([5] * 3, state.repeat(3, 1))]
    data = HeadData.from_answers(answers, 3)
    accuracy = head_accuracy(heads, data)
    assert [a.positions for a in accuracy] == [5 + 2, 4 + 1, 3 + 0]
    assert [a.top1 for a in accuracy] == [1.0, 1.0, 1.0]
    assert [a.offset for a in accuracy] == [2, 3, 4]
    # a wrong token after position 2 of the long answer: head 0 misses once, head 1 too
    answers[0] = Answer([5, 5, 5, 6, 5, 5], state.repeat(6, 1))
    accuracy = head_accuracy(heads, HeadData.from_answers(answers, 3))
    assert accuracy[0].top1 == pytest.approx(6 / 7) and accuracy[1].top1 == pytest.approx(4 / 5)
    assert accuracy[2].top1 == pytest.approx(2 / 3)
    assert all(a.top5 == 1.0 for a in accuracy)  # 6 is in every top 5


# --- loss ----------------------------------------------------------------------------


def test_loss_and_gradient_equal_plain_cross_entropy():
    torch.manual_seed(0)
    heads, positions, hidden, vocab = 3, 7, 16, 50
    feats = torch.randn(heads, positions, hidden, requires_grad=True)
    labels = torch.randint(0, vocab, (positions, heads))
    labels[-1, 1:] = IGNORE
    labels[-2, 2] = IGNORE
    weight = torch.randn(vocab, hidden)
    loss = heads_loss(feats, labels, weight)
    (grad,) = torch.autograd.grad(loss, feats)

    ref_feats = feats.detach().clone().requires_grad_(True)
    ref = sum(
        F.cross_entropy(ref_feats[k] @ weight.T, labels[:, k], ignore_index=IGNORE)
        for k in range(heads)
    )
    (ref_grad,) = torch.autograd.grad(ref, ref_feats)
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(grad, ref_grad)
    assert grad[1, -1].abs().sum() == 0  # an ignored pair contributes nothing

    low = heads_loss(feats, labels, weight.to(torch.bfloat16))
    assert low.item() == pytest.approx(ref.item(), rel=2e-2)


# --- training ------------------------------------------------------------------------


def test_training_lowers_the_loss_and_beats_untrained_heads_on_held_back_answers(tiny_target):
    model = tiny_target.model
    answers = greedy_answers(model, encode(tiny_target, PROMPTS), max_new_tokens=40)
    train = HeadData.from_answers(answers[:6], 3)
    held = HeadData.from_answers(answers[6:], 3)
    untrained = head_accuracy(tiny_heads(model, 3), held)

    heads = tiny_heads(model, 3)
    options = MedusaOptions(
        num_heads=3, epochs=30, positions_per_step=32, lr=1e-2, loss_dtype="float32"
    )
    stats = train_heads(heads, train, options)
    assert stats.steps == 30 * 8 and not stats.stopped_by_time
    assert sum(stats.losses[-5:]) < 0.5 * sum(stats.losses[:5])
    trained = head_accuracy(heads, held)
    for before, after in zip(untrained, trained):
        assert after.top1 >= before.top1 + 0.2, (untrained, trained)
    assert heads.shares_vocab_projection  # the projection was never replaced or trained
    assert heads.heads[0][-1].weight is model.lm_head.weight


def test_training_stops_at_its_time_limit(tiny_target):
    answers = greedy_answers(tiny_target.model, encode(tiny_target, PROMPTS[:2]), 16)
    stats = train_heads(
        tiny_heads(tiny_target.model, 2),
        HeadData.from_answers(answers, 2),
        MedusaOptions(num_heads=2, epochs=10_000, positions_per_step=4),
        seconds=0.5,
    )
    assert stats.stopped_by_time and 0 < stats.epochs < 10_000


def test_train_medusa_reports_on_held_back_answers(tiny_target):
    options = MedusaOptions(num_heads=2, max_new_tokens=16, epochs=2, time_budget_s=None)
    prompts = encode(tiny_target, PROMPTS)
    result = train_medusa(tiny_target, prompts[:6], prompts[6:], options)
    assert result.held_back_tokens == 2 * 16 and result.train_tokens == 6 * 16
    assert [a.positions for a in result.accuracy] == [2 * 15, 2 * 14]  # 16 tokens: 15, 14
    assert result.stats.epochs == 2


# --- the saved folder ----------------------------------------------------------------


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def write_prompts(path: Path, texts=PROMPTS) -> Path:
    path.write_text(
        "".join(json.dumps({"prompt": t, "id": f"p{i}"}) + "\n" for i, t in enumerate(texts))
    )
    return path


@pytest.fixture
def trained_folder(tmp_path, tiny_llama_dir):
    """`autotune heads train` run on the tiny model: (heads folder, model folder, result)."""
    out = tmp_path / "out"
    result = invoke(
        "heads",
        "train",
        "--kind",
        "medusa",
        "--model",
        tiny_llama_dir,
        "--prompts",
        write_prompts(tmp_path / "p.jsonl"),
        "--out",
        out,
        "--num-heads",
        3,
        "--max-new-tokens",
        24,
        "--epochs",
        3,
        "--threads",
        1,
    )
    return out, tiny_llama_dir, result


def test_command_writes_a_folder_that_loads(trained_folder):
    folder, model_dir, result = trained_folder
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    assert f"wrote {folder}" in result.stdout
    assert "top-5" in result.stdout and "t+4" in result.stdout  # the table, 3 heads
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(model_dir)
    heads = load_medusa_heads(folder, lm_head=model.lm_head.weight)
    assert heads.num_heads == 3 and heads.num_layers == 1
    assert heads.shares_vocab_projection and heads.heads[0][-1].weight is model.lm_head.weight
    assert any(h[0].linear.weight.abs().sum() > 0 for h in heads.heads)  # trained, not zero-init

    config = json.loads((folder / "config.json").read_text())
    assert config["medusa_num_heads"] == 3 and config["medusa_num_layers"] == 1
    assert config["base_model_name_or_path"] == str(model_dir.resolve())
    record = config["autotune"]
    assert record["model"] == "tiny-llama" and len(record["model_fingerprint"]) == 16
    # a third of the search split is left unseen, for `profile` to measure the heads on
    assert record["prompts"]["train"] == len(record["prompts"]["trained_on"])
    assert record["prompts"]["train"] + record["prompts"]["held_back"] < len(PROMPTS)
    assert trained_on(folder, record["prompts"]["file"]) == set(record["prompts"]["trained_on"])
    assert trained_on(folder, folder / "other.jsonl") == set()
    assert [row["head"] for row in record["accuracy_held_back"]] == [0, 1, 2]
    for row in record["accuracy_held_back"]:
        assert 0.0 <= row["top1"] <= row["top5"] <= 1.0 and row["positions"] > 0
    assert record["training"]["epochs"] == 3 and record["options"]["num_heads"] == 3
    assert record["options"]["loss_dtype"] in ("float32", "bfloat16")
    seconds = record["seconds"]  # a tiny model's job, its states computed earlier: ~0 s
    assert set(seconds) == {"generation", "training", "report", "total"}
    assert seconds["total"] >= seconds["training"] >= 0


def test_a_config_that_misstates_the_head_count_loads_the_weights_count(trained_folder, tmp_path):
    import shutil

    folder = tmp_path / "copy"
    shutil.copytree(trained_folder[0], folder)
    config = json.loads((folder / "config.json").read_text())
    config["medusa_num_heads"] = 5
    (folder / "config.json").write_text(json.dumps(config))
    assert load_medusa_heads(folder).num_heads == 3


def test_a_folder_without_weights_is_a_clear_error(tmp_path):
    folder = tmp_path / "no-weights"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"medusa_num_heads": 3, "medusa_num_layers": 1}))
    with pytest.raises(HeadsError, match=r"no medusa_lm_head.safetensors or medusa_lm_head.pt"):
        load_medusa_heads(folder)


# --- the command's bad input ---------------------------------------------------------


@pytest.fixture
def no_model_load(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(autotune.models, "load_target", refuse)


def assert_user_error(result, *words: str) -> str:
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def test_unknown_head_kind(tmp_path, no_model_load):
    out = tmp_path / "out"
    assert_user_error(
        invoke("heads", "train", "--kind", "hydra", "--out", out), "hydra", "medusa, eagle"
    )
    assert not out.exists()


def test_bad_model(tmp_path, no_model_load, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    out = tmp_path / "out"
    assert_user_error(
        invoke("heads", "train", "--kind", "medusa", "--model", "nosuch", "--out", out),
        "nosuch",
        "vicuna-13b",
    )
    assert_user_error(
        invoke("heads", "train", "--kind", "medusa", "--model", "vicuna-7b", "--out", out),
        "vicuna-7b",
        "--model-path",
    )
    assert not out.exists()


def test_bad_prompts(tmp_path, tiny_llama_dir, no_model_load):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "fine"}\nnot json\n')
    out = tmp_path / "out"
    assert_user_error(
        invoke(
            "heads",
            "train",
            "--kind",
            "medusa",
            "--model",
            tiny_llama_dir,
            "--prompts",
            bad,
            "--out",
            out,
        ),
        "bad.jsonl",
        "line 2",
    )
    one = write_prompts(tmp_path / "one.jsonl", PROMPTS[:1])
    assert_user_error(
        invoke(
            "heads",
            "train",
            "--kind",
            "medusa",
            "--model",
            tiny_llama_dir,
            "--prompts",
            one,
            "--out",
            out,
        ),
        "at least two",
    )
    assert not out.exists()


@pytest.mark.parametrize("where", ["a_file", "under_a_file", "proc"])
def test_unwritable_out(tmp_path, tiny_llama_dir, no_model_load, where):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    out = {"a_file": blocker, "under_a_file": blocker / "heads", "proc": Path("/proc/nope/heads")}[
        where
    ]
    assert_user_error(
        invoke("heads", "train", "--kind", "medusa", "--model", tiny_llama_dir, "--out", out),
        "--out",
    )
    assert blocker.read_text() == "x"


def test_help_lists_heads_train():
    assert "heads" in invoke("--help").stdout
    result = invoke("heads", "train", "--help")
    assert result.exit_code == 0
    for option in (
        "--kind",
        "--model",
        "--out",
        "--num-heads",
        "--prompts",
        "--max-new-tokens",
        "--epochs",
        "--threads",
        "--time-budget",
    ):
        assert option in result.stdout
