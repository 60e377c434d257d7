"""Exports of an n-gram profile to the engines that draft without weights. Option names
as their sources have them (checked by ``tests/test_ngram_export.py``):

- ``vllm``: ``speculative_config`` of the V1 engine (``vllm/config/speculative.py``):
  ``method: ngram`` with ``prompt_lookup_min``, ``prompt_lookup_max`` (both 5 when
  omitted) and ``num_speculative_tokens``; or ``method: suffix`` (needs
  ``arctic-inference``) with ``suffix_decoding_max_tree_depth`` (the match and the draft
  together), ``suffix_decoding_max_spec_factor``, ``suffix_decoding_min_token_prob`` and
  ``suffix_decoding_max_cached_requests``. vLLM verifies one path per step.
- ``sglang``: ``--speculative-algorithm NGRAM`` with ``--speculative-num-draft-tokens``
  (the root included), ``--speculative-ngram-{min,max}-match-window-size``,
  ``--speculative-ngram-{min,max}-bfs-breadth``, ``--speculative-ngram-match-type BFS|PROB``
  and ``--speculative-ngram-branch-length`` (renamed ``--speculative-ngram-max-trie-depth``
  in later releases): its cache is a trie of earlier tokens, drafted breadth first.
- ``hf``: transformers' ``prompt_lookup_num_tokens`` and ``max_matching_ngram_size``
  (``PromptLookupCandidateGenerator``: sizes from the maximum down to 1, the earliest
  match, a chain); arguments of ``generate()`` or keys of ``generation_config.json``.
- ``llamacpp``: ``--spec-type ngram-simple`` (the most recent match of exactly n tokens,
  m tokens drafted), in both dialects: ``--spec-ngram-size-n/-m`` with ``--draft-max``
  (docs/speculative.md at commit 067318e), and the per-type
  ``--spec-ngram-simple-size-n/-m`` of newer builds (llama.cpp PR #22397).
- ``trtllm``: the LLM API's ``NGramDecodingConfig`` (``decoding_type: NGram``,
  ``max_draft_len``, ``max_matching_ngram_size``, ``is_keep_all``, ``is_use_oldest``,
  ``is_public_pool``), PyTorch backend; a chain.

Where the profile holds an engine's own setting (``engines``: tuned and measured drafting
by that engine's rule, ``drafters.engine_lookup``), the export to that engine writes it
(``Method.for_engine``), and nothing is lost in the translation.
"""

from __future__ import annotations

from autotune.drafters.engine_lookup import EngineLookupConfig
from autotune.drafters.ngram import LookupConfig
from autotune.drafters.suffix import SuffixConfig
from autotune.export import load
from autotune.export.base import Deployment, Rendered, about_text, json_text
from autotune.export.engines import VERIFIABLE
from autotune.measure.load import requests_text
from autotune.methods.export_common import engine_exporter, flags_file, trtllm_file, vllm_file
from autotune.methods.ngram.settings import Config, NgramSettings, describe


def per_category_warning(title: str, spec: NgramSettings) -> list[str]:
    """Engines take one setting per server: the per-category ones are said, not dropped."""
    if not spec.by_category:
        return []
    own = "; ".join(f"{c}: {describe(s)}" for c, s in spec.category_configs().items())
    return [
        f"{title} takes one setting for every request: the per-category settings of the "
        f"profile ({own}) are not expressible; this file holds the global setting (serve "
        f"each of those workloads from a server of its own, exported from its setting, "
        f"to use them)"
    ]


def chain_warning(title: str, config: Config, length: int) -> list[str]:
    """What is lost when an engine drafts one continuation where the profile drafts a
    tree."""
    if not isinstance(config, SuffixConfig) and config.candidates == 1:
        return []
    what = (
        f"tree of {config.candidates} continuations"
        if isinstance(config, LookupConfig)
        else "a frequency-weighted tree"
    )
    return [
        f"{title} drafts one continuation per step: the profile's {what} (up to "
        f"{config.max_tree_tokens} tokens) becomes a chain of {length} tokens, so fewer "
        f"tokens are accepted per step than were measured"
    ]


def prefer_of(config: Config) -> str | None:
    """Which occurrence the setting drafts after ("recent", "first"; None: suffix
    decoding weighs them all)."""
    return None if isinstance(config, SuffixConfig) else config.prefer


OCCURRENCE = {"first": "earliest", "recent": "most recent"}


def occurrence_warning(drafter: str, config: Config, takes: str) -> list[str]:
    """A drafter that always drafts after one occurrence of a match (``takes``: "first",
    "recent") where the profile prefers the other."""
    prefer = prefer_of(config)
    if prefer is None or prefer == takes:
        return []
    return [
        f"{drafter} drafts after the {OCCURRENCE[takes]} match; the profile prefers the "
        f"{OCCURRENCE[prefer]} one, so its drafts differ where a match recurs"
    ]


def rule_warning(title: str, engine: str, config: Config) -> list[str]:
    """A setting tuned as another engine drafts, exported to this one."""
    if not isinstance(config, EngineLookupConfig) or config.engine == engine:
        return []
    return [
        f"this setting was tuned and measured as {config.engine} drafts; {title}'s own "
        f"matching rule differs, so its drafts and speed differ (profile with --engine "
        f"{engine} to tune for {title})"
    ]


def suffix_warning(title: str, config: Config, instead: str) -> list[str]:
    if not isinstance(config, SuffixConfig):
        return []
    return [
        f"{title} has no suffix decoding: the profile's ({describe(config)}) is "
        f"approximated by {instead}"
    ]


def chain_engine_warnings(title: str, config: Config, length: int, instead: str) -> list[str]:
    """What an engine that drafts a chain by prompt lookup loses: suffix decoding
    (approximated by ``instead``) and the tree (a chain of ``length`` tokens)."""
    return suffix_warning(title, config, instead) + chain_warning(title, config, length)


def server_warnings(title: str, engine: str, spec: NgramSettings, config: Config) -> list[str]:
    """What an engine serving this setting to every request, by its own matching rule,
    does not do as the profile measured."""
    return per_category_warning(title, spec) + rule_warning(title, engine, config)


def chain_length(config: Config) -> int:
    return min(config.draft_tokens, config.max_tree_tokens)


# --- vLLM ----------------------------------------------------------------------------------


def render_vllm(d: Deployment) -> Rendered:
    spec = d.settings
    config = spec.config()
    if isinstance(config, SuffixConfig):
        body, warnings, notes = _vllm_suffix(config)
    else:
        body, warnings, notes = _vllm_ngram(config, d)
    warnings += server_warnings("vLLM", "vllm", spec, config)
    return vllm_file(VLLM, d, body, warnings, notes, "n-gram")


def _vllm_ngram(
    config: LookupConfig | EngineLookupConfig, d: Deployment
) -> tuple[dict, list[str], list[str]]:
    warnings = chain_warning("vLLM", config, config.draft_tokens)
    if config.prefer == "recent":
        warnings.append(
            "vLLM drafts after the earliest of the longest matches; the profile prefers "
            "the most recent one, so vLLM's drafts differ where a match recurs"
        )
    body = {
        "method": "ngram",
        "num_speculative_tokens": config.draft_tokens,
        "prompt_lookup_min": config.min_match,
        "prompt_lookup_max": config.max_match,
    }
    return body, warnings, [_rule_note("vLLM", "vllm", config, d)]


def _vllm_suffix(config: SuffixConfig) -> tuple[dict, list[str], list[str]]:
    warnings = chain_warning("vLLM", config, chain_length(config))
    if config.min_match > 1:
        warnings.append(
            f"vLLM's suffix decoding drafts after matches of any length: min_match "
            f"{config.min_match} is not expressible"
        )
    body = {
        "method": "suffix",
        "num_speculative_tokens": chain_length(config),
        "suffix_decoding_max_tree_depth": config.max_match + config.draft_tokens,
        "suffix_decoding_max_spec_factor": config.tokens_per_match,
        "suffix_decoding_min_token_prob": config.min_probability,
        "suffix_decoding_max_cached_requests": 0,
    }
    notes = [
        "needs Arctic Inference (pip install arctic-inference)",
        "suffix_decoding_max_cached_requests 0 drafts from each request's own prompt and "
        "output, as measured; a positive value adds a tree of earlier responses",
        _no_match_note("vLLM"),
    ]
    return body, warnings, notes


def _no_match_note(title: str) -> str:
    return (
        f"{title} drafts nothing when no match is found (autotune's drafter proposes one "
        f"guessed token then)"
    )


def _rule_note(
    title: str, engine: str, config: Config, d: Deployment, otherwise: str | None = None
) -> str:
    """How the figures relate to the engine's drafting: its own rule, or autotune's
    (``otherwise``: what differs then; default: drafting without a match)."""
    tuned_in = d.settings.search.get("tuned_in")
    if tuned_in:
        return f"tuned and measured in {tuned_in} itself, on search prompts"
    if isinstance(config, EngineLookupConfig) and config.engine == engine and d.in_engine:
        return (
            f"tuned in autotune's engine drafting by {title}'s own rule, then measured in "
            f"{d.in_engine.measured_in} itself on held-back prompts (the figure above)"
        )
    if isinstance(config, EngineLookupConfig) and config.engine == engine:
        check = (
            f"measure it in {title} itself with `autotune verify PROFILE --engine {engine}`"
            if engine in VERIFIABLE
            else f"autotune does not run {title}: measure it there with {title}'s own benchmark"
        )
        return (
            f"tuned and measured in autotune's engine drafting by {title}'s own rule (its "
            f"matching, no draft without a match): {check}"
        )
    return otherwise or _no_match_note(title)


# --- SGLang --------------------------------------------------------------------------------


def render_sglang(d: Deployment) -> Rendered:
    spec = d.settings
    config = spec.config()
    if not isinstance(config, SuffixConfig):
        breadth, match_type = config.candidates, "BFS"
    else:
        # PROB ranks every branch by frequency: no breadth cap beyond the tree's size
        breadth, match_type = config.max_tree_tokens, "PROB"
    flags = [
        ("--speculative-algorithm", "NGRAM"),
        ("--speculative-num-draft-tokens", config.max_tree_tokens + 1),
        ("--speculative-ngram-min-bfs-breadth", 1),
        ("--speculative-ngram-max-bfs-breadth", breadth),
        ("--speculative-ngram-match-type", match_type),
        ("--speculative-ngram-max-trie-depth", config.max_match + config.draft_tokens),
    ]
    notes = [
        "append these flags to: python -m sglang.launch_server --model-path MODEL",
        "--speculative-num-draft-tokens counts the last verified token too",
        "--speculative-ngram-max-trie-depth holds the match and the drafted continuation together",
    ]
    return flags_file(SGLANG, d, _sglang_warnings(spec, config), notes, flags)


def _sglang_warnings(spec: NgramSettings, config: Config) -> list[str]:
    warnings = [
        "SGLang drafts from a trie of the tokens its requests produced (a cache shared "
        "across requests), breadth first, with a breadth that narrows as the match grows: "
        "the profile's tree shape is approximated by its size, breadth and depth",
        f"SGLang matches suffixes of any length its trie holds (its match window flags "
        f"were removed, PR #21225): the profile's match window ({config.min_match} to "
        f"{config.max_match} tokens) is not expressible",
    ]
    if isinstance(config, SuffixConfig):
        warnings.append(
            f"SGLang's PROB match type ranks branches by frequency like suffix decoding, "
            f"but has no tree size per matched token (tokens_per_match "
            f"{config.tokens_per_match}) nor probability floor (min_probability "
            f"{config.min_probability}); its breadth is the tree's size"
        )
    warnings += server_warnings("SGLang", "sglang", spec, config)
    if spec.load is not None and spec.load.levels:
        warnings.append(
            "SGLang's adaptive schedule (--speculative-adaptive) serves EAGLE with topk 1 "
            "only: the schedule under load is not written for NGRAM"
            + (
                f"; speculation measured no faster from {requests_text(spec.load.crossover)} in "
                "flight"
                if spec.load.crossover
                else ""
            )
        )
    return warnings


# --- transformers --------------------------------------------------------------------------


def hf_settings(config: Config) -> dict:
    """transformers' prompt-lookup keys for a setting."""
    return {
        "prompt_lookup_num_tokens": chain_length(config),
        "max_matching_ngram_size": config.max_match,
    }


def render_hf(d: Deployment) -> Rendered:
    spec = d.settings
    config = spec.config()
    length = chain_length(config)
    warnings = chain_engine_warnings(
        "transformers",
        config,
        length,
        f"prompt lookup of {length} tokens after n-grams of up to {config.max_match}",
    )
    if config.min_match > 1:
        warnings.append(
            f"transformers tries n-gram sizes from max_matching_ngram_size down to 1: "
            f"min_match {config.min_match} is not expressible (it also drafts after "
            f"shorter matches)"
        )
    warnings += occurrence_warning("transformers", config, takes="first")
    warnings += server_warnings("transformers", "hf", spec, config)
    notes = [
        "pass these keys to generate(): settings = json.load(open(FILE)); "
        "model.generate(ids, **settings); or merge them into the model folder's "
        "generation_config.json",
        _rule_note(
            "transformers",
            "hf",
            config,
            d,
            otherwise="transformers stops a draft at the end of the text and drafts nothing "
            "without a match (autotune's drafter continues a repeating span, and guesses one "
            "token)",
        ),
    ]
    return Rendered(
        json_text(hf_settings(config)), warnings, about=about_text(HF, d, warnings, notes)
    )


# --- llama.cpp -----------------------------------------------------------------------------

FLAGS = ("--spec-type", "--spec-ngram-simple-size-n", "--spec-ngram-simple-size-m")


def render_llamacpp(d: Deployment) -> Rendered:
    spec = d.settings
    config = spec.config()
    size_n, size_m = config.max_match, chain_length(config)
    warnings = chain_engine_warnings(
        "llama.cpp", config, size_m, f"ngram-simple: the most recent match of {size_n} tokens"
    )
    if config.min_match < config.max_match:
        warnings.append(
            f"ngram-simple matches exactly n tokens: n is the profile's max_match "
            f"({size_n}); after shorter matches (down to min_match {config.min_match}) it "
            f"drafts nothing"
        )
    warnings += occurrence_warning("ngram-simple", config, takes="recent")
    warnings += server_warnings("llama.cpp", "llamacpp", spec, config)
    notes = [
        "append these flags to: llama-server -m MODEL.gguf",
        f"ngram-simple drafts only where at least {size_n} tokens follow the match",
        _rule_note("llama.cpp", "llamacpp", config, d),
        *[n for n in [load.load_note(spec.load, "llama.cpp")] if n],
    ]
    if spec.load is not None and spec.load.crossover:
        notes.append(
            f"llama-server has no per-batch gate: with -np {spec.load.crossover} or more "
            "busy slots speculation measured no faster; serve without it there"
        )
    flags = zip(FLAGS, ("ngram-simple", size_n, size_m))
    return flags_file(LLAMACPP, d, warnings, notes, list(flags), one_line=True)


# --- TensorRT-LLM --------------------------------------------------------------------------


def render_trtllm(d: Deployment) -> Rendered:
    spec = d.settings
    config = spec.config()
    length = chain_length(config)
    prefer_first = prefer_of(config) in (None, "first")
    warnings = chain_engine_warnings(
        "TensorRT-LLM",
        config,
        length,
        f"its NGram drafter ({length} tokens after n-grams of up to {config.max_match})",
    )
    if config.min_match > 1:
        warnings.append(
            f"TensorRT-LLM matches n-grams of every size up to max_matching_ngram_size: "
            f"min_match {config.min_match} is not expressible"
        )
    warnings += server_warnings("TensorRT-LLM", "trtllm", spec, config)
    body = {
        "decoding_type": "NGram",
        "max_draft_len": length,
        "max_matching_ngram_size": config.max_match,
        "is_keep_all": True,
        "is_use_oldest": prefer_first,
        "is_public_pool": False,
    }
    notes = [
        "is_public_pool false drafts from each request's own tokens, as measured; true "
        "shares one pool across requests",
        "the PyTorch backend serves NGram; pass this file with --extra_llm_api_options",
        _rule_note("TensorRT-LLM", "trtllm", config, d),
    ]
    return trtllm_file(TRTLLM, d, body, warnings, notes, length)


VLLM = engine_exporter("vllm", "speculative_config method ngram or suffix", render_vllm)
SGLANG = engine_exporter("sglang", "python -m sglang.launch_server NGRAM flags", render_sglang)
HF = engine_exporter(
    "hf",
    "generate() prompt lookup (prompt_lookup_num_tokens, max_matching_ngram_size)",
    render_hf,
)
LLAMACPP = engine_exporter("llamacpp", "llama-server --spec-type ngram-simple", render_llamacpp)
TRTLLM = engine_exporter("trtllm", "LLM API NGramDecodingConfig (PyTorch backend)", render_trtllm)

EXPORTERS = {e.engine: e for e in (VLLM, SGLANG, HF, LLAMACPP, TRTLLM)}
CANNOT = {"dv": "Draft & Verify drafts only with the target's own layers skipped"}
