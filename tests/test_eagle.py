"""EAGLE drafting: head cache, static and dynamic trees, lossless decoding, and the
extrapolation measurement the static tree is grown from."""

from __future__ import annotations

import pytest
import torch

from autotune.drafters.eagle import EAGLE1_TREE, DynamicTree, EagleDrafter, StaticTree
from autotune.engine.decoding import decode_plain, decode_speculative
from autotune.engine.runner import Runner
from autotune.engine.sampling import SamplingConfig
from autotune.measure.eagle_accuracy import extrapolation_ranks, measure_eagle_accuracy

PROMPTS = [[1, 5, 9, 13, 40, 41], [1, 70, 3, 3, 3, 90, 12, 8, 77], [1, 22]]
TREES = [
    StaticTree(((0,), (0, 0), (0, 0, 0))),
    StaticTree(EAGLE1_TREE),
    StaticTree(((0,), (1,), (1, 0), (1, 1), (1, 1, 2))),
    DynamicTree(total_tokens=12, depth=3, top_k=3),
    DynamicTree(total_tokens=2, depth=0, top_k=1),
    DynamicTree(total_tokens=60, depth=5, top_k=10),
]


@pytest.mark.parametrize("tree", TREES, ids=lambda t: repr(t)[:40])
def test_greedy_eagle_decoding_is_lossless(tiny_llama, one_thread, tree, random_eagle_head):
    runner = Runner(tiny_llama)
    head = random_eagle_head(tiny_llama)
    for prompt in PROMPTS:
        plain = decode_plain(runner, prompt, 40)
        spec = decode_speculative(runner, EagleDrafter(head, tree), prompt, 40)
        assert spec.tokens == plain.tokens
        assert spec.steps <= len(plain.tokens)  # stops at the end-of-sequence token


@pytest.mark.parametrize("vocab", [None, list(range(0, 128, 2))], ids=["all", "even ids"])
@torch.inference_mode()
def test_drafter_accepts_what_the_extrapolation_measure_predicts(
    tiny_llama, one_thread, vocab, random_eagle_head
):
    """A chain is accepted as deep as the true tokens have rank 0 in the head's own
    extrapolation: the drafter (head cache, positions, masks, fed-back outputs) and the
    measurement the static trees are grown from must agree step by step."""
    from autotune.heads.eagle import DraftProjection

    runner = Runner(tiny_llama)
    head = random_eagle_head(tiny_llama, std=0.05)
    projection = DraftProjection(tiny_llama.lm_head, vocab)
    prompt, depth = PROMPTS[1], 3
    steps = []
    chain = StaticTree(((0,), (0, 0), (0, 0, 0)))
    result = decode_speculative(
        runner,
        EagleDrafter(head, chain, projection),
        prompt,
        40,
        on_verify=lambda d, path, logits: steps.append(len(path)),
    )
    tokens = prompt + result.tokens
    out = runner.forward(
        torch.tensor(tokens[:-1]), torch.arange(len(tokens) - 1), runner.new_cache(128)
    )
    first = len(prompt) - 1
    ranks = extrapolation_ranks(
        head, runner, runner.norm(out.hidden), tokens, first, depth, projection=projection
    )
    root = first
    for accepted in steps:
        row = ranks[root - first].tolist()
        expected = next((d for d, r in enumerate(row) if r != 0), depth)
        assert accepted == expected
        root += accepted + 1
    assert sum(steps) > 0


def test_draft_vocabulary_maps_tokens_and_keeps_output(tiny_llama, one_thread, random_eagle_head):
    from autotune.heads.eagle import DraftProjection

    runner = Runner(tiny_llama)
    vocab = list(range(100, 20, -3))  # any order of any subset
    projection = DraftProjection(tiny_llama.lm_head, vocab)
    ids = torch.tensor([100, 97, 5, 22, 127])
    assert projection.indices(ids).tolist() == [0, 1, -1, 26, -1]
    assert projection.tokens(torch.tensor([0, 26])).tolist() == [100, 22]
    hidden = torch.randn(3, tiny_llama.config.hidden_size)
    with torch.inference_mode():
        assert torch.allclose(projection(hidden), tiny_llama.lm_head(hidden)[:, vocab], atol=1e-5)
    head = random_eagle_head(tiny_llama)
    seen = []
    for tree in (StaticTree(EAGLE1_TREE), DynamicTree(12, 3, 3)):
        for prompt in PROMPTS:
            result = decode_speculative(
                runner,
                EagleDrafter(head, tree, projection),
                prompt,
                30,
                on_verify=lambda d, path, logits: seen.extend(d.tokens),
            )
            assert result.tokens == decode_plain(runner, prompt, 30).tokens
    assert seen and set(seen) <= set(vocab)  # drafts come from the vocabulary


def test_sampled_eagle_decoding_runs_and_keeps_length(tiny_llama, one_thread, random_eagle_head):
    runner = Runner(tiny_llama)
    drafter = EagleDrafter(random_eagle_head(tiny_llama), DynamicTree(10, 2, 3))
    result = decode_speculative(
        runner, drafter, PROMPTS[1], 25, SamplingConfig(temperature=0.8, seed=3)
    )
    assert len(result.tokens) == 25 or result.tokens[-1] in runner.eos_token_ids


def test_dynamic_tree_keeps_best_nodes_as_a_tree(tiny_llama, one_thread, random_eagle_head):
    runner = Runner(tiny_llama)
    seen = []
    decode_speculative(
        runner,
        EagleDrafter(random_eagle_head(tiny_llama), DynamicTree(9, 3, 2)),
        PROMPTS[0],
        20,
        on_verify=lambda draft, path, logits: seen.append(draft),
    )
    for draft in seen:
        assert draft.tree.size == len(draft.tokens) <= 8
        assert max(draft.tree.depths) <= 4  # depth expansions after the first level


def _sequential_ranks(head, runner, features, tokens, root, depth):
    """The true token's rank at each step for one root, drafting one step at a time."""
    cache = head.new_cache(64)
    ids = torch.tensor(tokens)
    out = head(
        features[None, : root + 1],
        runner.embed(ids[1 : root + 2])[None],
        torch.arange(root + 1)[None],
        cache,
    )[0, -1:]
    ranks = []
    for k in range(1, depth + 1):
        if root + k + 1 >= len(tokens):  # no true token at this depth
            ranks.append(-1)
            continue
        if k > 1:
            out = head(
                out[None],
                runner.embed(ids[root + k : root + k + 1])[None],
                torch.tensor([[root + k - 1]]),
                cache,
            )[0]
        order = runner.lm_head(out)[0].argsort(descending=True).tolist()
        rank = order.index(tokens[root + k + 1])
        ranks.append(rank if rank < 10 else -1)
    return ranks


@torch.inference_mode()
def test_extrapolation_ranks_match_one_root_at_a_time(tiny_llama, one_thread, random_eagle_head):
    runner = Runner(tiny_llama)
    head = random_eagle_head(tiny_llama)
    prompt = PROMPTS[1]
    tokens = prompt + decode_plain(runner, prompt, 12).tokens
    out = runner.forward(
        torch.tensor(tokens[:-1]), torch.arange(len(tokens) - 1), runner.new_cache(64)
    )
    features = runner.norm(out.hidden)
    first = len(prompt) - 1
    ranks = extrapolation_ranks(head, runner, features, tokens, first, depth=4).tolist()
    assert len(ranks) == len(tokens) - 1 - first
    for i, row in enumerate(ranks):
        assert row == _sequential_ranks(head, runner, features, tokens, first + i, 4)


def test_path_accuracy_predicts_accepted_chain_length(tiny_llama, one_thread, random_eagle_head):
    """Along greedy decoding, the chain [0], [0, 0], ... is accepted exactly as far as the
    true tokens have rank 0: the measured chain accuracy sums give the accepted count."""
    runner = Runner(tiny_llama)
    head = random_eagle_head(tiny_llama)
    prompt = PROMPTS[0]
    continuation = decode_plain(runner, prompt, 30).tokens
    accuracy = measure_eagle_accuracy(runner, head, [(prompt, continuation)], depth=3)
    assert 0 < accuracy.top1[0] <= 1 and len(accuracy.positions) == 3
    assert accuracy.positions[0] == accuracy.positions[1] + 1 == accuracy.positions[2] + 2
    chain = sum(accuracy.path_accuracy.get((0,) * d, 0.0) for d in (1, 2, 3))
    assert chain >= accuracy.path_accuracy.get((0, 0, 0), 0.0)


SMALL_EAGLE_SPACE = """\
calibration: {prompts: 3, tokens: 16, max_rank: 4, max_depth: 3, draft_vocab: [0, 24]}
static: {max_nodes: 8, candidates: 2, trials: 2}
dynamic: {total_tokens: [2, 10], depth: [0, 2], top_k: [1, 3], trials: 2}
trials: {prompts: 2, tokens: 10}
"""
WORDS = [
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


@pytest.mark.ray
def test_eagle_profile_and_bench_end_to_end(
    tmp_path, tiny_llama, tiny_llama_dir, run_autotune, random_eagle_head
):
    import json

    from autotune.heads.eagle import save_draft_vocab, save_eagle_head
    from autotune.profile.io import read_profile

    head_dir = save_eagle_head(
        random_eagle_head(tiny_llama),
        tmp_path / "head",
        tiny_llama.model.embed_tokens.weight,
        "tiny",
    )
    save_draft_vocab(head_dir, {token: 100 - token for token in range(3, 60)})
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join(json.dumps({"prompt": f"Tell me about {w}.", "id": w}) + "\n" for w in WORDS)
    )
    space = tmp_path / "eagle.yaml"
    space.write_text(SMALL_EAGLE_SPACE)
    cape_space = tmp_path / "cape.yaml"
    cape_space.write_text(
        "calibration: {prompts: 2, tokens: 12}\nfine_bins: 10\n"
        "max_expansion: 4\nmax_chain_depth: 3\n"
        "selection: {prompts: 2, tokens: 8}\n"
    )
    out = tmp_path / "p.yaml"
    done = run_autotune(
        [
            "profile",
            "--model",
            tiny_llama_dir,
            "--methods",
            "eagle,cape",
            "--heads",
            f"eagle={head_dir}",
            "--search-space",
            f"eagle={space}",
            "--search-space",
            f"cape={cape_space}",
            "--storage",
            f"sqlite:///{tmp_path / 'db.sqlite'}",
            "--out",
            out,
            "--prompts",
            prompts,
            "--time-budget",
            200,
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
    block = read_profile(out).methods.eagle
    assert block is not None and block.measured.lossless is True
    assert set(block.alternatives) == {"static", "dynamic"}
    # the kept kind is the faster on search prompts (the held-back split is not used)
    kept = block.alternatives[block.tree.kind]["search_speedup"]
    assert kept == max(a["search_speedup"] for a in block.alternatives.values())
    assert block.search["finalists_on_search_prompts"][block.tree.kind] == kept
    assert set(block.study) == {"static", "dynamic"} and "/eagle-dynamic/" in block.study["dynamic"]
    assert block.search["static_trials"] and block.search["dynamic_trials"]
    assert set(block.search["draft_vocab"]) == {"0", "24"} and block.draft_vocab in (0, 24)
    if block.tree.kind == "static":
        assert max(len(p) for p in block.tree.choices) <= 3 and len(block.tree.choices) <= 8
    else:
        assert 2 <= block.tree.total_tokens <= 10 and block.tree.top_k <= 3
    check_eagle_cape_block(block)

    bench = run_autotune(
        ["bench", out, "--json", "--max-new-tokens", 10, "--prompts", prompts, "--threads", 1],
        cwd=tmp_path,
    )
    assert bench.returncode == 0, bench.stderr[-3000:]
    rows = json.loads(bench.stdout)
    row = rows["eagle"]
    assert row["lossless"] is True and row["prompts"] == len(WORDS)


def check_eagle_cape_block(block) -> None:
    """CAPE fitted on a chain of the tuned head, its depth within the space, and kept or
    not by decoding on search prompts."""
    cape = block.cape
    assert cape is not None and 1 <= cape.chain_depth <= 3
    assert cape.bins[-1] == 1.0 and max(cape.expansion) <= 4
    assert set(cape.search["predicted_no_expansion_by_chain"]) == {
        f"chain depth {d}" for d in (1, 2, 3)
    }
    selection = cape.search["selection_on_search_prompts"]
    assert cape.enabled == (selection["with"] > selection["without"])


@pytest.mark.ray
def test_profile_eagle_without_a_head_is_a_one_line_error(tmp_path, tiny_llama_dir, run_autotune):
    done = run_autotune(
        [
            "profile",
            "--model",
            tiny_llama_dir,
            "--methods",
            "eagle",
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
        .startswith("error: --methods eagle: no eagle heads given or found: pass --heads")
    )
    done = run_autotune(
        [
            "profile",
            "--model",
            tiny_llama_dir,
            "--methods",
            "eagle",
            "--heads",
            f"eagle={tmp_path}",
            "--out",
            tmp_path / "p.yaml",
        ],
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 2 and "needs config.json and model.safetensors" in done.stderr
    assert not (tmp_path / "p.yaml").exists()


def test_head_for_another_model_is_refused(tmp_path, tiny_llama, random_eagle_head):
    from transformers import LlamaConfig

    from autotune.heads.eagle import load_eagle_head, save_eagle_head
    from autotune.heads.medusa import HeadsError

    folder = save_eagle_head(
        random_eagle_head(tiny_llama),
        tmp_path / "head",
        tiny_llama.model.embed_tokens.weight,
        "tiny",
    )
    other = LlamaConfig(vocab_size=128, hidden_size=32, num_attention_heads=4)
    with pytest.raises(HeadsError, match=r"hidden size 64 .* the model has 32"):
        load_eagle_head(folder, other)
    (folder / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(HeadsError, match="cannot read EAGLE weights"):
        load_eagle_head(folder, tiny_llama.config)


@pytest.mark.embedded
def test_trained_head_decodes_the_embedded_model_losslessly(embedded_target, tmp_path):
    """A head trained briefly by the real trainer on the embedded model, saved and loaded
    back: static, dynamic and draft-vocabulary decoding equal plain greedy decoding."""
    from autotune.heads.eagle import DraftProjection, load_draft_vocab, load_eagle_head
    from autotune.training.eagle import EagleOptions, train_eagle

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
    options = EagleOptions(max_new_tokens=24, epochs=2, time_budget_s=None, depth=2)
    result = train_eagle(target, ids[:4], ids[4:], options)
    folder = result.save(tmp_path / "head", target, "smollm2-135m", {})
    runner = Runner(target.model)
    head = load_eagle_head(folder, target.model.config)
    ranked = load_draft_vocab(folder)
    assert ranked and len(ranked) == len(set(ranked))
    projection = DraftProjection(runner.lm_head, ranked[:64])
    for prompt in ids[4:]:
        reference = decode_plain(runner, prompt, 32).tokens
        for tree, vocab in (
            (StaticTree(EAGLE1_TREE), None),
            (DynamicTree(10, 2, 3), None),
            (StaticTree(((0,), (0, 0))), projection),
        ):
            result = decode_speculative(runner, EagleDrafter(head, tree, vocab), prompt, 32)
            assert result.tokens == reference
