"""EAGLE head training (`autotune heads train --kind eagle`): the pairs and targets it
builds, the unrolled step's attention, the loss, training on the tiny random LLaMA (whose
greedy answers fall into short loops: a pattern a head can learn), the saved folder and
the command's errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

import autotune.models
from autotune.cli import app
from autotune.engine.runner import Runner
from autotune.errors import AutotuneError
from autotune.heads.eagle import load_eagle_head
from autotune.measure.eagle_accuracy import measure_eagle_accuracy
from autotune.training.distill import Answer, answer_prompts, greedy_answers
from autotune.training.eagle import (
    Batch,
    EagleOptions,
    EagleSequence,
    eagle_accuracy,
    eagle_loss,
    new_head,
    train_eagle,
    train_eagle_head,
    unrolled_mask,
)
from autotune.training.job import HeadsJob, run_heads_train, trained_on
from autotune.training.kinds import kind
from autotune.training.loss import IGNORE, TrainingVocab
from autotune.training.medusa import MedusaOptions

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


@pytest.fixture
def tiny_data(tiny_target):
    """(train, held-back) sequences: the tiny model's answers to 6 + 2 prompts."""
    prompts = [tiny_target.encode_chat(t) for t in PROMPTS]
    train, held = answer_prompts(tiny_target, prompts[:6], prompts[6:], 40, 4, prefill=True)
    return ([EagleSequence.of(p, a) for p, a in train], [EagleSequence.of(p, a) for p, a in held])


def options(**changes) -> EagleOptions:
    return EagleOptions(**{"loss_dtype": "float32", "time_budget_s": None, **changes})


# --- data ----------------------------------------------------------------------------


def test_every_positions_features_match_a_plain_forward(tiny_target):
    model = tiny_target.model
    prompts = [tiny_target.encode_chat(t) for t in ("Hi.", "Write a poem about rain, please.")]
    assert len({len(p) for p in prompts}) == 2  # the states right-padded, the padding stripped
    answers = greedy_answers(model, prompts, max_new_tokens=10, batch_size=2, prefill=True)
    for prompt, answer in zip(prompts, answers):
        seq = EagleSequence.of(prompt, answer)
        assert seq.tokens.tolist() == prompt + answer.tokens
        assert seq.answer_start == len(prompt)
        with torch.inference_mode():
            plain = model.model(input_ids=seq.tokens[None]).last_hidden_state[0]
        # f_0 .. f_{n-2}: every position but the last token's, prompt included
        torch.testing.assert_close(seq.features, plain[:-1], atol=1e-4, rtol=1e-4)
    # the Medusa path keeps only what it kept: same answers, no prefill
    plain_answers = greedy_answers(model, prompts, max_new_tokens=10, batch_size=2)
    assert [a.tokens for a in plain_answers] == [a.tokens for a in answers]
    assert all(a.prefill is None for a in plain_answers)
    with pytest.raises(ValueError, match="prefill=True"):
        EagleSequence.of(prompts[0], plain_answers[0])


def hand_made() -> list[EagleSequence]:
    """Feature f_t holds t in every unit (so targets show which positions they are)."""

    def sequence(prompt, answer):
        n = len(prompt) + len(answer)
        features = torch.arange(n - 1.0)[:, None].repeat(1, 4)
        return EagleSequence.of(
            prompt, Answer(answer, features[len(prompt) - 1 :], features[: len(prompt) - 1])
        )

    return [sequence([10, 11, 12], [20, 21, 22]), sequence([10], [30, 31])]


def test_pairs_and_targets_on_a_hand_made_example():
    long, short = hand_made()
    assert long.features[:, 0].tolist() == [0, 1, 2, 3, 4]  # f_0 .. f_4 for 6 tokens
    batch = Batch.of([long, short], unroll=2)
    assert batch.size == 5  # pair rows t = 0 .. 4
    read, positions, target, truth = batch.step(1)
    # row t reads (f_t, x_{t+1}) at position t; targets f_{t+1} and x_{t+2}, counted only
    # when x_{t+2} is an answer token (t = 1: x_3 = 20 is the answer's first)
    assert read.tolist() == [[11, 12, 20, 21, 22], [30, 31, 0, 0, 0]]
    assert positions.tolist() == [[0, 1, 2, 3, 4]] * 2
    assert target[0, :, 0].tolist() == [1, 2, 3, 4, 0]
    assert truth.tolist() == [[IGNORE, 20, 21, 22, IGNORE], [31] + [IGNORE] * 4]
    assert (truth != IGNORE).sum(1).tolist() == [long.counted, short.counted] == [3, 1]
    # step 2 reads step 1's output with the true x_{t+2} at position t + 1
    read, positions, target, truth = batch.step(2)
    assert read[0].tolist() == [12, 20, 21, 22, 0]
    assert positions[0].tolist() == [1, 2, 3, 4, 5]
    assert target[0, :, 0].tolist() == [2, 3, 4, 0, 0]
    assert truth.tolist() == [[20, 21, 22, IGNORE, IGNORE], [IGNORE] * 5]


def test_prompt_rows_are_trained_on_with_the_targets_own_next_tokens():
    long, _ = hand_made()
    labelled = EagleSequence(long.tokens, long.features, long.answer_start, torch.tensor([41, 42]))
    # index 1 and 2 of the prompt [10, 11, 12]: what the target would write after 10, 10 11
    assert labelled.labels().tolist() == [IGNORE, 41, 42, 20, 21, 22]
    assert labelled.counted == long.counted + 1 == 4  # x_2's row (t = 0) joins
    read, _, _, truth = Batch.of([labelled], unroll=2).step(1)
    assert read[0].tolist() == [11, 12, 20, 21, 22]  # the text is still what it reads
    assert truth[0].tolist() == [42, 20, 21, 22, IGNORE]


def test_sequence_labels_its_prompt_with_the_targets_greedy_next_tokens(tiny_target):
    model = tiny_target.model
    prompt = tiny_target.encode_chat("Write a poem about rain, please.")
    answer = greedy_answers(model, [prompt], max_new_tokens=6, prefill=True)[0]
    seq = EagleSequence.of(prompt, answer, model.lm_head.weight)
    with torch.inference_mode():
        logits = model(input_ids=seq.tokens[None]).logits[0]
    greedy = logits.argmax(-1)
    assert seq.labels()[1:].tolist() == greedy[:-1].tolist()  # the answer is greedy too
    assert EagleSequence.of(prompt, answer).labels()[: len(prompt)].eq(IGNORE).all()


def test_unrolled_mask_sees_the_prefix_and_its_own_earlier_steps():
    allowed = unrolled_mask(3, 2, torch.tensor([4, 3]), torch.float32)[:, 0] == 0
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0],
            [1, 0, 0, 1, 0, 0],  # step 2 of root 0: f_0's pair, itself
            [1, 1, 0, 0, 1, 0],
            [1, 1, 1, 0, 0, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(allowed[0], expected)
    # the second sequence has 2 pair rows: row 2 is padding, hidden from the others
    padded = expected.clone()
    padded[:, [2, 5]] = False
    padded[2, 2] = padded[5, 5] = True
    assert torch.equal(allowed[1], padded)


def test_the_unrolled_step_is_the_heads_own_second_draft_step(tiny_llama):
    """Row (2, t) of the unrolled forward equals a causal forward over pairs 0 .. t and
    then (step-1 output at t, x_{t+2}) at position t + 1: what drafting computes."""
    torch.manual_seed(0)
    head = new_head(tiny_llama, "random")
    embed = tiny_llama.get_input_embeddings()
    seq = EagleSequence(torch.randint(3, 100, (9,)), torch.randn(8, 64), 4)
    batch = Batch.of([seq], unroll=2)
    size = batch.size
    steps = [batch.step(k) for k in (1, 2)]
    with torch.no_grad():
        first = head(batch.features[:, :size], embed(steps[0][0]), steps[0][1])
        both = head(
            torch.cat([batch.features[:, :size], first], 1),
            embed(torch.cat([steps[0][0], steps[1][0]], 1)),
            torch.cat([steps[0][1], steps[1][1]], 1),
            mask=unrolled_mask(size, 2, batch.lengths, torch.float32),
        )
        torch.testing.assert_close(both[:, :size], first)
        for t in (0, 3, 6):
            feats = torch.cat([seq.features[: t + 1], first[0, t : t + 1]])[None]
            tokens = torch.cat([seq.tokens[1 : t + 2], seq.tokens[t + 2 : t + 3]])[None]
            plain = head(feats, embed(tokens), torch.arange(t + 2)[None])
            torch.testing.assert_close(both[0, size + t], plain[0, -1])


def test_loss_counts_only_rows_whose_token_is_in_the_answer(tiny_llama):
    torch.manual_seed(0)
    head = new_head(tiny_llama, "random")
    embed, weight = tiny_llama.get_input_embeddings(), tiny_llama.lm_head.weight.detach()
    n, prompt = 10, 4
    seq = EagleSequence(torch.randint(3, 100, (n,)), torch.randn(n - 1, 64), prompt)
    scale = 1.7
    loss = eagle_loss(head, embed, Batch.of([seq], 1), weight, options(noise=0.0), scale)

    with torch.no_grad():
        out = head(seq.features[None], embed(seq.tokens[1:])[None], torch.arange(n - 1)[None])[0]
    rows = torch.arange(prompt - 2, n - 2)  # x_{t+2} = tokens[prompt .. n - 1]
    feature = F.smooth_l1_loss(out[rows] / scale, seq.features[rows + 1] / scale)
    token = F.cross_entropy(out[rows] @ weight.T, seq.tokens[rows + 2])
    assert loss.item() == pytest.approx((feature + 0.1 * token).item(), rel=1e-5)
    # over a training vocabulary: the softmax ranks only its tokens
    vocab = TrainingVocab.of(seq.labels(), weight.shape[0], size=len(set(seq.tokens.tolist())))
    small = eagle_loss(
        head,
        embed,
        Batch.of([seq], 1),
        vocab.weight(weight),
        options(noise=0.0),
        scale,
        None,
        vocab,
    )
    token = F.cross_entropy(out[rows] @ vocab.weight(weight).T, vocab.map(seq.tokens[rows + 2]))
    assert small.item() == pytest.approx((feature + 0.1 * token).item(), rel=1e-5)
    # a second step adds the loss of its own counted rows
    assert (
        eagle_loss(
            head, embed, Batch.of([seq], 2), weight, options(noise=0.0, unroll=2), scale
        ).item()
        > loss.item()
    )


# --- training ------------------------------------------------------------------------


@pytest.mark.parametrize("unroll", [1, 2])
def test_training_lowers_the_loss_and_beats_the_untrained_head(tiny_llama, tiny_data, unroll):
    train, held = tiny_data
    untrained = eagle_accuracy(new_head(tiny_llama), tiny_llama, held, depth=5)
    head = new_head(tiny_llama)
    stats = train_eagle_head(head, tiny_llama, train, options(epochs=40, lr=3e-3, unroll=unroll))
    assert stats.steps == 40 * 3 and not stats.stopped_by_time
    assert sum(stats.losses[-5:]) < 0.75 * sum(stats.losses[:5])
    trained = eagle_accuracy(head, tiny_llama, held, depth=5)
    assert [row.depth for row in trained] == [1, 2, 3, 4, 5]
    assert [row.offset for row in trained] == [2, 3, 4, 5, 6]
    assert trained[0].top1 >= untrained[0].top1 + 0.5, (untrained, trained)
    mean = lambda rows: sum(r.top1 for r in rows) / len(rows)  # noqa: E731
    assert mean(trained) >= mean(untrained) + 0.2, (untrained, trained)
    for row in trained:
        assert 0.0 <= row.top1 <= row.top5 <= 1.0
    # 2 answers of 40 tokens: depth d has a true token from 40 - d roots each
    assert [row.positions for row in trained] == [2 * (40 - d) for d in range(1, 6)]


def test_report_equals_the_measurement_code_on_a_fresh_target_pass(tiny_llama, tiny_data):
    train, held = tiny_data
    head = new_head(tiny_llama)
    train_eagle_head(head, tiny_llama, train, options(epochs=5, lr=3e-3))
    ours = eagle_accuracy(head, tiny_llama, held, depth=4)
    pairs = [
        (s.tokens[: s.answer_start].tolist(), s.tokens[s.answer_start :].tolist()) for s in held
    ]
    theirs = measure_eagle_accuracy(Runner(tiny_llama), head, pairs, depth=4, max_rank=5)
    assert [r.top1 for r in ours] == pytest.approx(theirs.top1)
    assert [r.top5 for r in ours] == pytest.approx(theirs.top5)
    assert [r.positions for r in ours] == theirs.positions


def test_training_stops_at_its_time_limit(tiny_llama, tiny_data):
    stats = train_eagle_head(
        new_head(tiny_llama),
        tiny_llama,
        tiny_data[0],
        options(epochs=10_000, sequences_per_step=1),
        seconds=0.5,
    )
    assert stats.stopped_by_time and 0 < stats.epochs < 10_000


def test_train_eagle_reports_on_held_back_answers(tiny_target):
    prompts = [tiny_target.encode_chat(t) for t in PROMPTS]
    result = train_eagle(
        tiny_target, prompts[:6], prompts[6:], options(max_new_tokens=16, epochs=2, depth=3)
    )
    assert result.held_back_tokens == 2 * 16 and result.train_tokens == 6 * 16
    assert [a.positions for a in result.accuracy] == [2 * 15, 2 * 14, 2 * 13]
    assert result.stats.epochs == 2 and result.seconds["total"] > 0


def test_answers_too_short_to_train_on(tiny_llama):
    seq = EagleSequence(torch.tensor([5, 6]), torch.randn(1, 64), 1)  # one answer token
    assert seq.counted == 0
    with pytest.raises(AutotuneError, match="too short"):
        train_eagle_head(new_head(tiny_llama), tiny_llama, [seq], options())


# --- the saved folder ----------------------------------------------------------------


def write_prompts(path: Path, texts=PROMPTS) -> Path:
    path.write_text(
        "".join(json.dumps({"prompt": t, "id": f"p{i}"}) + "\n" for i, t in enumerate(texts))
    )
    return path


@pytest.mark.ray
def test_command_writes_a_folder_that_loads_to_the_same_head(
    tmp_path, tiny_llama_dir, run_autotune
):
    prompts = write_prompts(tmp_path / "p.jsonl")
    done = run_autotune(
        [
            "heads",
            "train",
            "--kind",
            "eagle",
            "--model",
            tiny_llama_dir,
            "--prompts",
            prompts,
            "--max-new-tokens",
            24,
            "--epochs",
            3,
            "--threads",
            1,
        ],
        cwd=tmp_path,
        timeout=300,
    )
    assert done.returncode == 0, (done.stdout, done.stderr)
    # by default into autotune's heads cache, under the model's fingerprint, where
    # `profile` finds them
    fingerprint = autotune.models.registry.fingerprint(
        autotune.models.resolve_model(str(tiny_llama_dir))
    )
    folder = tmp_path / "cache" / "heads" / fingerprint / "eagle"
    assert f"wrote {folder}" in done.stdout.replace("\n", "")
    assert "depth" in done.stdout and "t+6" in done.stdout  # the table, depths 1 .. 5

    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(tiny_llama_dir)
    head = load_eagle_head(folder, model.config)
    assert head.fc.weight.abs().sum() > 0
    config = json.loads((folder / "config.json").read_text())
    record = config["autotune"]
    assert record["trained_by"] == "autotune heads train --kind eagle"
    assert record["model"] == "tiny-llama" and record["options"]["init"] == "random"
    assert record["prompts"]["train"] == len(record["prompts"]["trained_on"]) > 0
    assert trained_on(folder, prompts) == set(record["prompts"]["trained_on"])
    assert [row["depth"] for row in record["accuracy_held_back"]] == [1, 2, 3, 4, 5]
    assert record["training"]["epochs"] == 3 and record["training"]["final_loss"] > 0


def test_saved_head_gives_identical_outputs(tmp_path, tiny_target, tiny_data):
    from autotune.training.eagle import EagleTrainer
    from autotune.training.loop import TrainStats
    from autotune.training.trainer import TrainResult

    model = tiny_target.model
    head = new_head(model)
    train_eagle_head(head, model, tiny_data[0], options(epochs=2, lr=3e-3))
    result = TrainResult(
        EagleTrainer(),
        head,
        accuracy=[],
        stats=TrainStats(),
        train_tokens=0,
        held_back_tokens=0,
        seconds={},
    )
    result.save(tmp_path / "h", tiny_target, "tiny", {})
    loaded = load_eagle_head(tmp_path / "h", model.config)
    torch.manual_seed(1)
    features, embeds = torch.randn(2, 7, 64), torch.randn(2, 7, 64)
    positions = torch.arange(7)[None].expand(2, -1)
    with torch.no_grad():
        assert torch.equal(loaded(features, embeds, positions), head(features, embeds, positions))


# --- bad input -----------------------------------------------------------------------


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture
def no_model_load(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(autotune.models, "load_target", refuse)


def test_medusa_only_options_are_refused(tmp_path, tiny_llama_dir, no_model_load):
    out = tmp_path / "out"
    result = invoke(
        "heads",
        "train",
        "--kind",
        "eagle",
        "--model",
        tiny_llama_dir,
        "--num-heads",
        3,
        "--out",
        out,
    )
    assert result.exit_code == 2, (result.stdout, result.stderr, result.exception)
    line = result.stderr.strip()
    assert line.startswith("error: ") and "--num-heads" in line and "Medusa" in line
    assert not out.exists()


def test_options_with_applies_given_values_and_refuses_missing_options():
    given = {"num_heads": None, "max_new_tokens": 32, "epochs": None, "time_budget_s": 9.0}
    options = kind("eagle").options_with(given)
    assert options == EagleOptions(max_new_tokens=32, time_budget_s=9.0)
    assert kind("medusa").options_with({"num_heads": 3}) == MedusaOptions(num_heads=3)
    with pytest.raises(AutotuneError) as refused:
        kind("eagle").options_with({**given, "num_heads": 3})
    assert str(refused.value) == (
        "--num-heads is for Medusa heads only: an EAGLE head is one decoder layer that "
        "drafts depth by depth; leave --num-heads out"
    )
    with pytest.raises(AutotuneError, match="--num-heads is for Medusa heads only: a GLIDE"):
        kind("glide").options_with({"num_heads": 3})
    with pytest.raises(AutotuneError, match="medusa heads have no option 'block'"):
        kind("medusa").options_with({"block": 3})


def test_bad_options(tmp_path, tiny_llama_dir, no_model_load):
    with pytest.raises(AutotuneError, match="init 'zeros'"):
        EagleOptions(init="zeros")
    with pytest.raises(AutotuneError, match="at least 1"):
        EagleOptions(unroll=0)
    job = HeadsJob(kind="eagle", model=str(tiny_llama_dir), options=MedusaOptions())
    with pytest.raises(ValueError, match="EagleOptions"):
        run_heads_train(job)
