"""Exports of an n-gram profile: every field an engine gets is one of the option names its
own source defines (vLLM ``SpeculativeConfig``, SGLang ``ServerArgs``, transformers
``GenerationConfig``, llama.cpp ``common/arg.cpp``, TensorRT-LLM ``NGramDecodingConfig``),
with the profile's values; what an engine cannot express is a warning in the file; and
transformers' own ``generate`` runs with the exported keys and gives plain greedy output."""

from __future__ import annotations

import copy
import json
import shlex

import pytest
import yaml
from typer.testing import CliRunner

from autotune.drafters.ngram import LookupConfig
from autotune.drafters.suffix import SuffixConfig
from autotune.errors import AutotuneError
from autotune.export import ENGINES, export_profile
from autotune.methods import registry
from autotune.methods.ngram.settings import Config, NgramSettings, block_of
from autotune.profile.blocks import Measured
from autotune.profile.schema import ProfileBase, methods_block

# The option names each engine's source defines for draft-free speculation.
VLLM_OPTIONS = {
    "method",
    "num_speculative_tokens",
    "prompt_lookup_min",
    "prompt_lookup_max",
    "suffix_decoding_max_tree_depth",
    "suffix_decoding_max_cached_requests",
    "suffix_decoding_max_spec_factor",
    "suffix_decoding_min_token_prob",
}
SGLANG_FLAGS = {
    "--speculative-algorithm",
    "--speculative-num-draft-tokens",
    "--speculative-ngram-min-bfs-breadth",
    "--speculative-ngram-max-bfs-breadth",
    "--speculative-ngram-match-type",
    "--speculative-ngram-max-trie-depth",
}
HF_KEYS = {"prompt_lookup_num_tokens", "max_matching_ngram_size"}
LLAMACPP_FLAGS = {"--spec-type", "--spec-ngram-simple-size-n", "--spec-ngram-simple-size-m"}
TRTLLM_OPTIONS = {
    "decoding_type",
    "max_draft_len",
    "max_matching_ngram_size",
    "is_keep_all",
    "is_use_oldest",
    "is_public_pool",
}

TREE = LookupConfig(1, 3, 6, 3, 2, 12, "recent")
CHAIN = LookupConfig(2, 4, 8, 1, 1, 8, "first")
SUFFIX = SuffixConfig(2, 8, 10, 16, tokens_per_match=1.5, min_probability=0.1)


def ngram_profile(config: Config, by_category: dict[str, Config] | None = None) -> ProfileBase:
    from test_profile import make_profile

    measured = Measured(
        speedup=1.42,
        speedup_interval=[1.21, 1.63],
        tokens_per_step=2.1,
        acceptance_rate=0.4,
        tokens_per_s=60.0,
        baseline_tokens_per_s=42.0,
        lossless=True,
        prompts=20,
    )
    block = NgramSettings(
        draft=block_of(config),
        by_category={c: block_of(s) for c, s in (by_category or {}).items()},
        measured=measured,
    )
    return make_profile().model_copy(
        update={"methods": methods_block(ngram=block), "recommended": "ngram"}
    )


def speculative_config(text: str) -> dict:
    data = yaml.safe_load(text)
    assert list(data) == ["speculative_config"]
    return data["speculative_config"]


def flag_words(text: str) -> list[str]:
    body = " ".join(line.rstrip("\\") for line in text.splitlines() if not line.startswith("#"))
    return shlex.split(body)


def test_every_engine_is_served_or_refused_with_a_reason():
    method = registry.get("ngram")
    assert set(method.exporters) == {"vllm", "sglang", "hf", "llamacpp", "trtllm"}
    assert set(method.exporters) | set(method.cannot_export) == set(ENGINES)
    for engine in method.exporters:
        export = export_profile(ngram_profile(CHAIN), engine)
        said = export.about if export.about is not None else export.text
        assert export.method == "ngram" and export.engine_version in said


def test_vllm_ngram():
    export = export_profile(ngram_profile(CHAIN), "vllm")
    config = speculative_config(export.text)
    assert config == {
        "method": "ngram",
        "num_speculative_tokens": 8,
        "prompt_lookup_min": 2,
        "prompt_lookup_max": 4,
    }
    assert set(config) <= VLLM_OPTIONS
    command = next(line for line in export.text.splitlines() if "--speculative-config" in line)
    assert json.loads(command.split("'")[1]) == config
    assert export.warnings == ()  # a chain of the earliest match: what vLLM does


def test_vllm_tree_and_recency_are_warned():
    export = export_profile(ngram_profile(TREE), "vllm")
    assert speculative_config(export.text)["num_speculative_tokens"] == 6
    assert any("tree of 3 continuations" in w for w in export.warnings)
    assert any("earliest" in w for w in export.warnings)
    assert all(f"# warning: {w}" in export.text for w in export.warnings)


def test_vllm_suffix():
    config = speculative_config(export_profile(ngram_profile(SUFFIX), "vllm").text)
    assert set(config) <= VLLM_OPTIONS
    assert config["method"] == "suffix"
    assert config["suffix_decoding_max_tree_depth"] == 8 + 10  # match and draft together
    assert config["suffix_decoding_max_spec_factor"] == 1.5
    assert config["suffix_decoding_min_token_prob"] == 0.1
    assert config["suffix_decoding_max_cached_requests"] == 0
    assert config["num_speculative_tokens"] == 10


@pytest.mark.parametrize("config,match_type,breadth", [(TREE, "BFS", "3"), (SUFFIX, "PROB", "16")])
def test_sglang(config, match_type, breadth):
    export = export_profile(ngram_profile(config), "sglang")
    words = flag_words(export.text)
    flags = dict(zip(words[::2], words[1::2]))
    assert set(flags) == SGLANG_FLAGS and len(words) == 2 * len(flags)
    assert flags["--speculative-algorithm"] == "NGRAM"
    assert flags["--speculative-num-draft-tokens"] == str(config.max_tree_tokens + 1)
    assert flags["--speculative-ngram-max-trie-depth"] == str(
        config.max_match + config.draft_tokens
    )
    assert flags["--speculative-ngram-match-type"] == match_type
    assert flags["--speculative-ngram-max-bfs-breadth"] == breadth


def test_hf_fragment():
    export = export_profile(ngram_profile(TREE), "hf")
    # generation keys only: transformers' generate() refuses any other key
    assert json.loads(export.text) == {"prompt_lookup_num_tokens": 6, "max_matching_ngram_size": 3}
    assert export.about is not None and "earliest match" in export.about
    assert any("earliest match" in w for w in export.warnings)
    suffix = export_profile(ngram_profile(SUFFIX), "hf")
    assert json.loads(suffix.text) == {"prompt_lookup_num_tokens": 10, "max_matching_ngram_size": 8}
    assert any("no suffix decoding" in w for w in suffix.warnings)


def test_llamacpp_flags_of_the_pinned_release():
    export = export_profile(ngram_profile(TREE), "llamacpp")
    lines = [line.split() for line in export.text.splitlines() if not line.startswith("#")]
    assert len(lines) == 1
    flags = dict(zip(lines[0][::2], lines[0][1::2]))
    assert flags == {
        "--spec-type": "ngram-simple",
        "--spec-ngram-simple-size-n": "3",
        "--spec-ngram-simple-size-m": "6",
    }
    assert any("exactly n tokens" in w for w in export.warnings)


def test_trtllm():
    config = speculative_config(export_profile(ngram_profile(CHAIN), "trtllm").text)
    assert set(config) == TRTLLM_OPTIONS
    assert config["decoding_type"] == "NGram"
    assert config["max_draft_len"] == 8 and config["max_matching_ngram_size"] == 4
    assert config["is_use_oldest"] is True and config["is_public_pool"] is False
    recent = speculative_config(export_profile(ngram_profile(TREE), "trtllm").text)
    assert recent["is_use_oldest"] is False


@pytest.mark.parametrize("engine", ["vllm", "sglang", "hf", "llamacpp", "trtllm"])
def test_per_category_settings_are_said_not_dropped(engine):
    profile = ngram_profile(CHAIN, {"summarization": TREE, "translation": SUFFIX})
    export = export_profile(profile, engine)
    said = [w for w in export.warnings if "per-category" in w]
    assert len(said) == 1
    assert "summarization" in said[0] and "translation" in said[0]
    # kept in the file itself, or beside it where the engine reads every key of the file
    assert "summarization" in (export.about or export.text)


@pytest.mark.embedded
def test_hf_export_runs_in_transformers_and_equals_greedy(embedded_target, one_thread, monkeypatch):
    """transformers' own generate, given the exported keys (as arguments, and merged into
    the model's generation config), drafts by prompt lookup with exactly those settings,
    and its output is its own plain greedy output."""
    import torch
    from transformers.generation import candidate_generator

    export = export_profile(ngram_profile(TREE), "hf")
    settings = json.loads(export.text)  # as the export's note says: **json.load(file)
    seen = []
    original_init = candidate_generator.PromptLookupCandidateGenerator.__init__

    def spy(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        seen.append((self.num_output_tokens, self.max_matching_ngram_size))

    monkeypatch.setattr(candidate_generator.PromptLookupCandidateGenerator, "__init__", spy)
    model = embedded_target.model
    fruits = "apples, oranges, bananas, pears"
    text = f"Repeat the following list: {fruits}, {fruits}."  # an answer that repeats itself
    ids = torch.tensor([embedded_target.encode_chat(text)])
    new_tokens = 24
    plain = model.generate(ids, do_sample=False, max_new_tokens=new_tokens)
    assert not seen  # plain greedy looks nothing up
    wanted = (settings["prompt_lookup_num_tokens"], settings["max_matching_ngram_size"])
    looked_up = model.generate(ids, do_sample=False, max_new_tokens=new_tokens, **settings)
    assert seen == [wanted]
    own = model.generation_config
    try:
        merged_config = copy.deepcopy(own)  # as generation_config.json with the keys added
        merged_config.update(**settings)
        model.generation_config = merged_config
        merged = model.generate(ids, do_sample=False, max_new_tokens=new_tokens)
    finally:
        model.generation_config = own
    assert seen == [wanted, wanted]
    assert looked_up.tolist() == plain.tolist() == merged.tolist()
    assert plain.shape[1] == ids.shape[1] + new_tokens


# --- each engine's own setting ---------------------------------------------------------


def with_engine_variants(profile: ProfileBase, low: float = 1.08) -> ProfileBase:
    """The profile with llama.cpp's and vLLM's own settings, measured on search prompts."""
    from autotune.drafters.engine_lookup import EngineLookupConfig
    from autotune.profile.blocks import EngineVariant, Figures

    def variant(config: EngineLookupConfig) -> EngineVariant:
        figures = Figures(
            speedup=low + 0.1,
            speedup_interval=[low, low + 0.2],
            tokens_per_step=1.6,
            acceptance_rate=0.3,
            tokens_per_s=50.0,
            baseline_tokens_per_s=42.0,
            lossless=True,
            prompts=6,
        )
        return EngineVariant(
            setting=block_of(config).model_dump(), description="own", selection=figures
        )

    block = profile.block("ngram")
    engines = {
        "llamacpp": variant(EngineLookupConfig("llamacpp", 3, 3, 5)),
        "vllm": variant(EngineLookupConfig("vllm", 2, 3, 7)),
    }
    return profile.model_copy(
        update={"methods": methods_block(ngram=block.model_copy(update={"engines": engines}))}
    )


def test_an_engine_with_a_setting_of_its_own_gets_it_without_warnings():
    profile = with_engine_variants(ngram_profile(TREE, {"copy": SUFFIX}))
    out = export_profile(profile, "llamacpp")
    assert out.text.splitlines()[-1] == (
        "--spec-type ngram-simple --spec-ngram-simple-size-n 3 --spec-ngram-simple-size-m 5"
    )
    assert not out.warnings  # a chain by llama.cpp's own rule, one setting: nothing lost
    assert "1.180x plain greedy" in out.text and "6 search prompts" in out.text
    config = yaml.safe_load(export_profile(profile, "vllm").text)["speculative_config"]
    assert config == {
        "method": "ngram",
        "num_speculative_tokens": 7,
        "prompt_lookup_min": 2,
        "prompt_lookup_max": 3,
    }
    # an engine without a setting of its own gets the profile's, with what it loses
    sglang = export_profile(profile, "sglang")
    assert "--speculative-ngram-max-bfs-breadth 3" in sglang.text and sglang.warnings


def test_an_engine_setting_no_faster_than_greedy_is_refused_unless_forced():
    profile = with_engine_variants(ngram_profile(TREE), low=0.9)
    with pytest.raises(AutotuneError, match=r"llama\.cpp drafts it measured 1\.000x"):
        export_profile(profile, "llamacpp")
    assert export_profile(profile, "llamacpp", force=True).text


def test_a_setting_tuned_for_one_engine_warns_in_another():
    from autotune.drafters.engine_lookup import EngineLookupConfig

    profile = ngram_profile(EngineLookupConfig("llamacpp", 3, 3, 6))
    assert not export_profile(profile, "llamacpp").warnings
    hf = export_profile(profile, "hf")
    assert any("tuned and measured as llamacpp drafts" in w for w in hf.warnings)
    assert json.loads(hf.text) == {"prompt_lookup_num_tokens": 6, "max_matching_ngram_size": 3}


def with_load(
    profile: ProfileBase, settings: list[tuple[int, str, int | None]], method: str = "ngram"
) -> ProfileBase:
    """The profile's ``method`` block with a schedule under load: (concurrency, setting,
    cap) per level; the crossover where every level from one on is off."""
    from autotune.measure.load import crossover
    from autotune.profile.blocks import Load, LoadLevel

    levels = [
        LoadLevel(
            concurrency=c,
            setting=setting,
            max_draft_tokens=cap,
            speedup=1.0 if setting == "off" else 1.2,
            speedup_interval=None if setting == "off" else [1.1, 1.3],
            tokens_per_s=50.0,
            baseline_tokens_per_s=42.0,
            tuned_speedup=0.9,
            rounds=4,
            lossless=True,
        )
        for c, setting, cap in settings
    ]
    load = Load(
        levels=levels,
        crossover=crossover({c: s for c, s, _ in settings}),
        max_new_tokens=64,
    )
    blocks = profile.method_blocks()
    blocks[method] = blocks[method].model_copy(update={"load": load})
    return profile.model_copy(update={"methods": methods_block(**blocks)})


SHRINKING = [(1, "tuned", None), (2, "<= 4 tokens", 4), (4, "off", 0), (8, "off", 0)]
PAYING = [(1, "tuned", None), (2, "<= 4 tokens", 4), (4, "<= 2 tokens", 2)]


def test_vllm_gets_a_draft_length_per_batch_size_from_the_schedule():
    export = export_profile(with_load(ngram_profile(CHAIN), SHRINKING), "vllm")
    config = speculative_config(export.text)
    # inclusive ranges from 1, one per level up to the next; off is 0 tokens, and vLLM
    # keeps the last range's 0 above it
    assert config["num_speculative_tokens_per_batch_size"] == [
        [1, 1, 8],
        [2, 3, 4],
        [4, 7, 0],
        [8, 8, 0],
    ]
    assert "speculation off from 4 requests in flight" in export.text
    assert not any("above" in w for w in export.warnings)
    paying = export_profile(with_load(ngram_profile(TREE), PAYING), "vllm")
    config = speculative_config(paying.text)
    assert config["num_speculative_tokens_per_batch_size"] == [[1, 1, 6], [2, 3, 4], [4, 4, 2]]
    assert any("above 4 requests in flight" in w for w in paying.warnings)
    command = next(line for line in paying.text.splitlines() if "--speculative-config" in line)
    assert json.loads(command.split("'")[1]) == config


def test_trtllm_gets_the_cutoff_and_is_told_what_its_ngram_drafter_cannot_take():
    export = export_profile(with_load(ngram_profile(CHAIN), SHRINKING), "trtllm")
    config = speculative_config(export.text)
    assert config["max_concurrency"] == 3 and "draft_len_schedule" not in config
    assert any("2 requests (4 tokens)" in w for w in export.warnings)
    paying = speculative_config(
        export_profile(with_load(ngram_profile(CHAIN), PAYING), "trtllm").text
    )
    assert "max_concurrency" not in paying


def test_engines_without_a_batch_gate_are_told_the_crossover():
    profile = with_load(ngram_profile(CHAIN), SHRINKING)
    llamacpp = export_profile(profile, "llamacpp").text
    assert "-np 4 or more" in llamacpp and "1: tuned 1.20x" in llamacpp
    sglang = export_profile(profile, "sglang")
    assert any("EAGLE with topk 1" in w and "from 4 requests" in w for w in sglang.warnings)


OFF_FROM_4 = [(1, "tuned", None), (2, "tuned", None), (4, "off", 0)]


@pytest.mark.parametrize("method", ["eagle", "medusa"])
def test_head_methods_get_the_per_batch_schedule_in_vllm_and_the_cutoff_in_trtllm(method):
    from test_export import fixture

    profile = with_load(fixture(method), OFF_FROM_4, method)
    config = speculative_config(export_profile(profile, "vllm", method, force=True).text)
    tokens = config["num_speculative_tokens"]
    assert config["num_speculative_tokens_per_batch_size"] == [
        [1, 1, tokens],
        [2, 3, tokens],
        [4, 4, 0],
    ]
    if "trtllm" in registry.method(method).exporters:
        trtllm = speculative_config(export_profile(profile, "trtllm", method, force=True).text)
        assert trtllm["max_concurrency"] == 3


def flags(text: str) -> list[str]:
    return shlex.split(" ".join(x.rstrip("\\") for x in text.splitlines() if x[:1] != "#"))


def test_an_eagle_chain_gets_its_schedule_as_sglangs_adaptive_config(tmp_path):
    """Topk 1: one slot per level keyed by its batch size, the level's steps its only
    candidate (0 off); the flags point to the file the export writes beside itself."""
    from test_export import branching_eagle, fixture

    from autotune.cli import app
    from autotune.profile.io import write_profile

    profile = with_load(fixture("eagle"), OFF_FROM_4, "eagle")
    export = export_profile(profile, "sglang", force=True)
    assert export.companion is not None
    assert json.loads(export.companion.text) == {
        "1": {"candidate_steps": [1]},
        "2": {"candidate_steps": [1]},
        "4": {"candidate_steps": [0]},
    }
    words = flags(export.text)
    assert "--speculative-adaptive" in words
    assert words[words.index("--speculative-adaptive-config") + 1] == export.companion.name
    # a branching tree (topk > 1) is not served by the adaptive schedule: said, not written
    branching = export_profile(with_load(branching_eagle(), OFF_FROM_4, "eagle"), "sglang")
    assert branching.companion is None and "--speculative-adaptive" not in flags(branching.text)
    assert any("topk 1" in w for w in branching.warnings)
    # on the command line both files are written, the flags naming the second
    path, out = tmp_path / "p.yaml", tmp_path / "deploy" / "flags.txt"
    write_profile(profile, path)
    args = ["export", str(path), "--engine", "sglang", "--force", "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.stderr
    schedule = tmp_path / "deploy" / "flags.adaptive.json"
    assert f"--speculative-adaptive-config {schedule}" in out.read_text()
    assert json.loads(schedule.read_text()) == json.loads(export.companion.text)
    printed = CliRunner().invoke(app, args[:-2])
    assert printed.exit_code == 0 and "pass --out to write both" in printed.stderr
