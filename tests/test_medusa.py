"""Medusa: head accuracy tables, the tuner's pieces, and profile + bench end to end."""

from __future__ import annotations

import json

import pytest
import torch

from autotune.engine.runner import Runner
from autotune.heads.medusa import MedusaHeads, save_medusa_heads
from autotune.measure.head_accuracy import measure_head_accuracy
from autotune.methods.medusa.trials import build_tree
from autotune.profile.io import read_profile

pytestmark = pytest.mark.usefixtures("one_thread")


class OracleHeads(MedusaHeads):
    """Heads that read the true continuation from a table: their accuracy is known."""

    def __init__(self, vocab: int, answers: dict[int, list[int]], hidden: torch.Tensor):
        super().__init__(hidden.shape[-1], vocab, num_heads=2)
        self.answers, self.hidden_rows = answers, hidden

    def forward(self, hidden, count=None):
        count = count or self.num_heads
        out = torch.zeros(count, hidden.shape[0], self.vocab_size)
        for i, row in enumerate(hidden):
            index = int((self.hidden_rows - row).abs().sum(-1).argmin())
            for k, token in enumerate(self.answers[index][:count]):
                if token is not None:
                    out[k, i, token] = 10.0 - k  # rank 0 for the answer
                    out[k, i, (token + 1) % self.vocab_size] = 20.0 if k == 1 else 0.0
        return out


def test_head_accuracy_counts_paths_directly_with_per_head_denominators(tiny_llama):
    """Head 0 always right at rank 0; head 1 right at rank 1 (its rank 0 is a decoy)."""
    runner = Runner(tiny_llama)
    prompt = [1, 5, 9, 33]
    continuation = [40, 41, 42, 43, 44, 45]
    sequence = prompt + continuation
    cache = runner.new_cache()
    out = runner.forward(torch.tensor(sequence[:-1]), torch.arange(len(sequence) - 1), cache)
    hidden = runner.norm(out.hidden[len(prompt) - 1 :])
    truth = sequence[len(prompt) - 1 :]
    answers = {
        j: [
            truth[j + 2] if j + 2 < len(truth) else None,
            truth[j + 3] if j + 3 < len(truth) else None,
        ]
        for j in range(len(hidden))
    }
    heads = OracleHeads(tiny_llama.config.vocab_size, answers, hidden)
    acc = measure_head_accuracy(runner, heads, [(prompt, continuation)], max_rank=3)
    # 6 continuation tokens: head 0 has answers at 5 positions, head 1 at 4
    assert acc.positions == [5, 4]
    assert acc.top_k[0] == pytest.approx([1.0, 1.0, 1.0])
    assert acc.top_k[1] == pytest.approx([0.0, 1.0, 1.0])
    assert acc.path_accuracy[(0,)] == pytest.approx(1.0)
    assert acc.path_accuracy[(0, 1)] == pytest.approx(1.0)
    assert (0, 0) not in acc.path_accuracy


def test_build_tree_never_returns_an_empty_tree():
    assert build_tree({}, "greedy", 8, 3, 10) == [(0,)]
    assert build_tree({}, "sequoia", 8, 3, 10) == [(0,)]
    tree = build_tree({(0,): 0.6, (1,): 0.2, (0, 0): 0.4}, "greedy", 2, 2, 10)
    assert tree == [(0,), (0, 0)]


SMALL_MEDUSA_SPACE = """\
calibration: {prompts: 3, tokens: 16, max_rank: 4}
tree: {max_nodes: 8, candidates: 2, trials: 3}
trials: {prompts: 2, tokens: 10}
typical: {pairs: [[0.09, 0.3], [0.2, 0.45]], prompts: 1, tokens: 10}
"""


@pytest.mark.ray
def test_medusa_profile_and_bench_end_to_end(
    tmp_path, tiny_llama, tiny_llama_dir, random_heads, run_autotune
):
    run_cli = run_autotune
    heads = random_heads(tiny_llama, num_heads=3, std=0.3)
    heads_dir = save_medusa_heads(heads, tmp_path / "heads", "tiny")
    config_json = json.loads((heads_dir / "config.json").read_text())
    config_json["medusa_num_heads"] = 5  # misstated, as published configs are
    (heads_dir / "config.json").write_text(json.dumps(config_json))

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"prompt": f"Tell me about {w}.", "id": w}) + "\n"
            for w in [
                "cats",
                "rain",
                "maps",
                "tea",
                "ships",
                "glass",
                "bread",
                "stars",
                "bees",
                "clay",
                "rivers",
                "snow",
            ]
        )
    )
    space = tmp_path / "medusa.yaml"
    space.write_text(SMALL_MEDUSA_SPACE)
    out = tmp_path / "p.yaml"
    done = run_cli(
        [
            "profile",
            "--model",
            tiny_llama_dir,
            "--methods",
            "medusa",
            "--heads",
            f"medusa={heads_dir}",
            "--search-space",
            f"medusa={space}",
            "--storage",
            f"sqlite:///{tmp_path / 'db.sqlite'}",
            "--out",
            out,
            "--prompts",
            prompts,
            "--time-budget",
            120,
            "--threads",
            1,
            "--heldback-prompts",
            3,
            "--max-new-tokens",
            12,
        ],
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "says 5 heads; the weights hold 3" in done.stderr
    block = read_profile(out).methods.medusa
    assert block is not None
    assert block.measured.lossless is True and block.measured.prompts == 3
    assert 1 <= block.num_heads <= 3
    assert max(len(p) for p in block.tree) == block.num_heads
    assert len(block.tree) <= 8
    assert block.study.endswith(block.study.split("/")[-1]) and "/medusa/" in block.study
    typical = block.acceptance.typical
    assert typical is not None and len(typical.sweep) == 2
    assert typical.min_fidelity == next(r["fidelity"] for r in typical.sweep if r["eps"] == 0.09)
    assert block.search["measured_trials"]

    bench = run_cli(
        ["bench", out, "--json", "--max-new-tokens", 10, "--prompts", prompts, "--threads", 1],
        cwd=tmp_path,
    )
    assert bench.returncode == 0, bench.stderr[-3000:]
    row = json.loads(bench.stdout)["medusa"]
    assert row["lossless"] is True and row["prompts"] == 12
    assert row["tokens_per_step"] >= 1.0


@pytest.mark.ray
def test_profile_medusa_without_heads_is_a_one_line_error(tmp_path, tiny_llama_dir, run_autotune):
    run_cli = run_autotune
    done = run_cli(
        [
            "profile",
            "--model",
            tiny_llama_dir,
            "--methods",
            "medusa",
            "--no-train-heads",
            "--out",
            tmp_path / "p.yaml",
        ],
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 2
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .startswith("error: --methods medusa: no medusa heads given or found: pass --heads")
    )
    done = run_cli(
        [
            "profile",
            "--model",
            tiny_llama_dir,
            "--methods",
            "medusa",
            "--heads",
            f"medusa={tmp_path}",
            "--out",
            tmp_path / "p.yaml",
        ],
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 2 and "no medusa_lm_head" in done.stderr
    assert not (tmp_path / "p.yaml").exists()


@pytest.mark.embedded
def test_trained_heads_decode_the_embedded_model_losslessly(embedded_target):
    """Heads trained briefly by the real trainer on the embedded model: Medusa tree
    decoding (fused and separate head products) equals plain greedy decoding."""
    from autotune.drafters.medusa import MedusaDrafter
    from autotune.engine.decoding import decode_plain, decode_speculative
    from autotune.training.medusa import MedusaOptions, train_medusa

    target = embedded_target
    texts = [
        "Name three fruits.",
        "What is rain?",
        "Say hello in French.",
        "Count to five.",
        "What is a cat?",
        "Describe the sea.",
    ]
    ids = [target.encode_chat(t) for t in texts]
    options = MedusaOptions(num_heads=3, max_new_tokens=24, epochs=2, time_budget_s=None)
    result = train_medusa(target, ids[:4], ids[4:], options)
    heads = result.trained
    runner = Runner(target.model)
    assert heads.shares_vocab_projection
    tree = [[0], [1], [0, 0], [2], [0, 1], [0, 0, 0]]
    for prompt in ids[4:]:
        reference = decode_plain(runner, prompt, 32).tokens
        for fused in (True, False):
            result = decode_speculative(runner, MedusaDrafter(heads, tree, fused=fused), prompt, 32)
            assert result.tokens == reference
