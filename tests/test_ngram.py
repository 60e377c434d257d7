"""Draft-free speculation (the ``ngram`` method): the per-sequence index, the tree merge,
both candidate policies, the exact replay the search is steered by, the coordinate
ascent, the per-category rule, and the tuning ladder end to end on a tiny LLaMA."""

from __future__ import annotations

import dataclasses
import json

import pytest

from autotune.drafters.engine_lookup import EngineLookupConfig
from autotune.drafters.ngram import (
    MAX_SCAN,
    Candidates,
    LookupConfig,
    NgramDrafter,
    TokenIndex,
    merge,
)
from autotune.drafters.suffix import SuffixConfig
from autotune.engine.decoding import decode_plain, decode_speculative
from autotune.measure.costs import LatencyCurve
from autotune.measure.timing import (
    EncodedPrompt,
    Measurement,
    PromptMeasurement,
    categories_in_turn,
)
from autotune.methods import registry
from autotune.methods.ngram.calibration import KINDS
from autotune.methods.ngram.replay import Continuation, Costs, Replayer, accepted_along, replay
from autotune.methods.ngram.search import Scored, ascend
from autotune.methods.ngram.settings import (
    NgramLookup,
    NgramSettings,
    block_of,
    config_of,
)
from autotune.methods.ngram.side_by_side import category_verdicts, entrants, with_default
from autotune.methods.ngram.space import PerCategory
from autotune.methods.ngram.trials import config_from_params, params_from_config

pytestmark = pytest.mark.usefixtures("one_thread")


def lookup(**changes) -> LookupConfig:
    base = LookupConfig(1, 3, 4, 1, 2, 16, "recent")
    return dataclasses.replace(base, **changes)


def suffix(**changes) -> SuffixConfig:
    base = SuffixConfig(1, 4, 4, 16, tokens_per_match=4.0, min_probability=0.0)
    return dataclasses.replace(base, **changes)


def paths_of(draft) -> set[tuple[int, ...]]:
    """Every root-to-node path of a draft, as token tuples."""
    out, parents = set(), draft.shape.parents
    for node in range(len(draft.tokens)):
        path, at = [], node
        while at != -1:
            path.append(draft.tokens[at])
            at = parents[at]
        out.add(tuple(reversed(path)))
    return out


# --- the index ----------------------------------------------------------------------------


def test_index_grown_step_by_step_equals_one_built_at_once():
    history = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 1, 4, 1, 5]
    grown, whole = TokenIndex(2), TokenIndex(2)
    for end in range(1, len(history) + 1):
        grown.sync(history[:end])
    whole.sync(history)
    assert grown.tokens == whole.tokens == history
    assert grown.earlier_ends() == whole.earlier_ends() == [4]  # "1 5" ended at 4 before
    assert whole.earlier_ends() != [len(history) - 1]  # never the query itself


def test_index_starts_again_for_another_sequence():
    index = TokenIndex(1)
    index.sync([7, 8, 7, 9])
    index.sync([1, 2, 1])  # not a continuation: a new sequence
    assert index.tokens == [1, 2, 1]
    assert index.earlier_ends() == [0]


def test_match_length_and_periodic_continuation():
    index = TokenIndex(1)
    index.sync([1, 2, 3, 9, 2, 3, 7, 1, 2, 3])
    assert index.earlier_ends() == [5, 2]  # most recent first
    assert index.match_length(2, cap=8) == 3  # "1 2 3"
    assert index.match_length(5, cap=8) == 2  # "2 3"
    assert index.match_length(2, cap=2) == 2
    assert index.continuation(2, 3) == (9, 2, 3)
    periodic = TokenIndex(1)
    periodic.sync([4, 5, 4, 5, 4])
    # after the last "4" came "5 4"; past the end the copy repeats its period
    assert periodic.continuation(2, 5) == (5, 4, 5, 4, 5)


def test_a_common_key_is_scanned_only_so_far():
    index = TokenIndex(1)
    index.sync([0] * (MAX_SCAN + 50))
    assert len(index.earlier_ends()) == MAX_SCAN
    assert len(index.earlier_ends(oldest_first=True)) == MAX_SCAN
    assert index.earlier_ends(oldest_first=True)[0] == 0


# --- the tree merge -----------------------------------------------------------------------


def test_merge_shares_prefixes_and_keeps_parents_first():
    found = Candidates([((1, 2, 3), 1.0), ((1, 4), 1.0), ((5,), 1.0)], budget=10)
    draft = merge(found)
    assert sorted(draft.tokens) == [1, 2, 3, 4, 5]  # "1" once
    assert all(p < node for node, p in enumerate(draft.shape.parents))
    assert draft.tokens[0] == 1  # two paths pass through it: it weighs most
    assert paths_of(draft) >= {(1, 2, 3), (1, 4), (5,)}


def test_merge_budget_cuts_the_lightest_nodes_and_the_worse_ranked():
    found = Candidates([((1, 2, 3), 1.0), ((1, 4), 1.0), ((5,), 1.0)], budget=3)
    assert paths_of(merge(found)) == {(1,), (1, 2), (1, 2, 3)}  # the best path first
    shared = Candidates([((1, 2), 1.0), ((1, 4), 3.0)], budget=2)
    assert paths_of(merge(shared)) == {(1,), (1, 4)}  # the heavier branch


def test_merge_drops_nodes_below_the_share_and_may_drop_everything():
    found = Candidates([((1, 2), 1.0)] * 9 + [((3,), 1.0)], budget=10, min_share=0.2)
    assert paths_of(merge(found)) == {(1,), (1, 2)}
    assert merge(Candidates([], budget=4)) is None


# --- the two policies ---------------------------------------------------------------------


def test_lookup_prefers_the_longest_match_then_recency_or_age():
    #          0  1  2  3  4  5  6  7  8  9 10 11
    history = [1, 2, 3, 8, 9, 2, 3, 6, 4, 2, 3, 7, 1, 2, 3]
    index = TokenIndex(1)
    index.sync(history)
    longest = lookup(candidates=1).candidates_for(index, depth=2)
    assert longest.paths == [((8, 9), 1.0)]  # "1 2 3" matched at 0..2
    recent = lookup(max_match=2, candidates=1).candidates_for(index, depth=2)
    assert recent.paths == [((7, 1), 1.0)]  # "2 3" everywhere: the latest wins
    first = lookup(max_match=2, candidates=1, prefer="first").candidates_for(index, depth=2)
    assert first.paths == [((8, 9), 1.0)]


def test_lookup_tree_holds_distinct_candidates_at_their_depths():
    history = [5, 1, 2, 5, 3, 4, 5, 1, 9, 5]
    drafter = NgramDrafter(lookup(candidates=3, draft_tokens=3, branch_tokens=1))
    draft = drafter.draft_for(history, max_tokens=50)
    paths = paths_of(draft)
    assert (1, 9, 5) in paths  # the most recent "5", 3 deep
    assert {(3,), (1,)} <= paths  # the others 1 deep ("5 1" again adds nothing)
    assert len(draft.tokens) == 4


def test_suffix_weighs_continuations_by_frequency_and_sizes_by_match():
    history = [7, 1, 2, 7, 1, 2, 7, 1, 3, 7, 1]
    index = TokenIndex(1)
    index.sync(history)
    found = suffix(max_match=2, tokens_per_match=1.5).candidates_for(index, depth=2)
    assert found.budget == 3  # 1.5 x a match of 2 tokens
    draft = merge(found)
    assert draft.tokens[0] == 2  # followed "7 1" twice, "3" once
    rare = merge(suffix(max_match=2, min_probability=0.5).candidates_for(index, depth=2))
    assert 3 not in rare.tokens


def test_no_match_proposes_one_guess_and_depth_respects_the_budget():
    drafter = NgramDrafter(lookup(min_match=2))
    assert drafter.draft_for([4, 5, 6, 5], max_tokens=9).tokens == [6]  # what followed "5"
    assert NgramDrafter(lookup()).draft_for([8], max_tokens=9).tokens == [8]
    long = NgramDrafter(lookup(draft_tokens=8))
    assert len(long.draft_for([1, 2, 3, 1, 2, 3, 1, 2], max_tokens=3).tokens) == 2


def test_settings_convert_both_ways_and_refuse_reversed_matches():
    for config in (lookup(candidates=3), suffix()):
        assert config_of(block_of(config)) == config
    with pytest.raises(ValueError, match="min_match"):
        NgramLookup(
            min_match=4,
            max_match=2,
            draft_tokens=3,
            candidates=1,
            branch_tokens=1,
            max_tree_tokens=3,
            prefer="recent",
        )
    with pytest.raises(ValueError):
        lookup(prefer="newest")
    data = NgramSettings(draft=block_of(suffix()), by_category={"qa": block_of(lookup())})
    back = NgramSettings.model_validate(json.loads(data.model_dump_json()))
    assert back.category_configs() == {"qa": lookup()} and back.config() == suffix()


def test_study_parameters_round_trip():
    space = registry.get("ngram").space()
    for config in (lookup(candidates=3, max_tree_tokens=12), suffix(tokens_per_match=2.0)):
        params = params_from_config(config, space)
        assert config_from_params(params) == config
    from autotune.methods.ngram.trials import distributions

    dists = distributions(space)
    for config in (config_of(NgramLookup(**space.ngram.start.model_dump())),):
        for name, value in params_from_config(config, space).items():
            assert value in dists[name].choices, name  # every seed lies inside the space


# --- the replay ---------------------------------------------------------------------------


def test_accepted_along_follows_the_tree():
    draft = merge(Candidates([((1, 2, 3), 1.0), ((1, 4), 1.0)], budget=9))
    assert accepted_along(draft, [1, 4, 9]) == 2
    assert accepted_along(draft, [1, 2, 3, 3]) == 3
    assert accepted_along(draft, [2]) == 0


@pytest.mark.parametrize(
    "config",
    [lookup(candidates=3, branch_tokens=2), lookup(prefer="first"), suffix(min_probability=0.1)],
    ids=["tree", "chain", "suffix"],
)
def test_replay_takes_exactly_the_steps_of_real_decoding(tiny_llama_dir, config):
    from autotune.models.ref import TargetRef

    runner = TargetRef.for_user(str(tiny_llama_dir)).runner()
    runner.eos_token_ids = frozenset()
    accepted = 0
    for prompt in ([1, 5, 9, 5, 9, 5, 9, 33], [1, 40, 41, 42, 40, 41, 42, 40], [1, 7]):
        tokens = 30
        plain = decode_plain(runner, prompt, tokens).tokens
        real = decode_speculative(runner, NgramDrafter(config), prompt, tokens)
        assert real.tokens == plain
        sizes = replay(NgramDrafter(config), Continuation(tuple(prompt), tuple(plain), tokens))
        assert sizes == real.draft_lengths
        accepted += real.accepted
    assert accepted > 0  # drafts were accepted: the steps really depend on the trees


def test_the_proxy_rewards_copying_and_caches_replays():
    prompt = tuple(range(10, 40))
    copy = Continuation(prompt, prompt[5:29], 24, "copy")
    fresh = Continuation(prompt, tuple(range(100, 124)), 24, "fresh")
    curve = LatencyCurve([1.0 + 0.02 * n for n in range(64)])
    replayer = Replayer([copy, fresh], lambda config: Costs(curve, 0.0))
    config = lookup(draft_tokens=8, max_tree_tokens=8)
    assert replayer.speedup(config, replayer.indices("copy")) > 2.0
    assert replayer.tokens_per_step(config, replayer.indices("copy")) > 3.0
    assert replayer.speedup(config, replayer.indices("fresh")) < 1.0  # guesses cost a little
    assert replayer.categories() == ["copy", "fresh"]
    before = dict(replayer._sizes)
    replayer.speedup(config, replayer.indices())
    assert replayer._sizes == before  # nothing replayed twice


# --- the search ---------------------------------------------------------------------------


def test_ascend_finds_the_best_of_a_separable_score_and_skips_refused_values():
    def score(config: LookupConfig) -> float:
        return -abs(config.draft_tokens - 6) - abs(config.candidates - 3) - config.min_match

    scored = Scored(score)
    grids = {"draft_tokens": [2, 4, 6, 8], "candidates": [1, 3, 5], "min_match": [1, 2, 9]}
    best = ascend(lookup(min_match=2), grids, scored, passes=3)
    assert (best.draft_tokens, best.candidates, best.min_match) == (6, 3, 1)
    assert all(c.min_match != 9 for c in scored.values)  # min_match 9 > max_match 3: refused
    assert scored.best(1)[0][0] == best


def test_ascend_stops_when_out_of_time():
    calls = []

    def score(config):
        calls.append(config)
        return float(config.draft_tokens)

    best = ascend(lookup(), {"draft_tokens": [5, 6, 7]}, score, passes=2, out_of_time=lambda: True)
    assert best == lookup() and len(calls) == 1


# --- the per-category rule ----------------------------------------------------------------


def measurement(rows) -> Measurement:
    return Measurement(
        [
            PromptMeasurement(f"p{i}", 50, 1.0, 50, seconds, 10, 20, 10, True, category)
            for i, (category, seconds) in enumerate(rows)
        ]
    )


def test_a_category_keeps_its_own_setting_only_when_clearly_faster():
    rows = [("sum", 0.5), ("sum", 0.52), ("sum", 0.49), ("qa", 0.99), ("qa", 1.0), ("qa", 0.98)]
    chosen = measurement([(c, 0.8 if c == "sum" else 1.0) for c, _ in rows])
    own = measurement(rows)
    rule = PerCategory(min_gain=0.05, confidence=0.9)
    verdicts = category_verdicts(
        own, chosen, {"sum": suffix(), "qa": suffix(), "mt": lookup()}, lookup(), rule
    )
    assert verdicts["sum"]["kept"] and verdicts["sum"]["speedup_vs_global"] > 1.5
    assert not verdicts["qa"]["kept"]  # 1% faster: not clearly
    assert not verdicts["mt"]["kept"]  # the global setting itself
    assert "prompts" in verdicts["sum"] and verdicts["sum"]["prompts"] == 3


def test_the_default_is_a_candidate_unless_a_winner_is_it():
    space = registry.get("ngram").space()
    default = LookupConfig(**space.ngram.start.model_dump())
    assert with_default(space, {"ngram": lookup(), "suffix": suffix()})["default"] == default
    assert "default" not in with_default(space, {"ngram": default, "suffix": suffix()})


def test_the_side_by_side_takes_what_its_least_prompts_can_decode_in_the_time_left():
    required = {"ngram": lookup(), "suffix": suffix()}
    rules = {"vllm rule": lookup(), "hf rule": lookup()}
    own = {"copy": suffix()}
    whole = entrants(required, rules, own, prompt_s=1.0, left=None)
    assert whole is not None and whole.left_out == []
    assert set(whole.candidates) == {"ngram", "suffix", "vllm rule", "hf rule"}
    assert whole.by_category == own
    # two prompts of greedy + three decoders at 0.9 of greedy's time: 7.4 s
    cut = entrants(required, rules, own, prompt_s=1.0, left=7.5)
    assert cut is not None and set(cut.candidates) == {"ngram", "suffix", "vllm rule"}
    assert cut.by_category == {} and cut.left_out == ["hf rule", "per-category settings"]
    assert entrants(required, rules, own, prompt_s=1.0, left=5.5) is None  # 5.6 s for two
    assert entrants(required, rules, own, prompt_s=1.0, left=0.0) is None


def test_spread_takes_categories_in_turn():
    prompts = [EncodedPrompt(str(i), [i], c) for i, c in enumerate("aaabbc")]
    assert [p.id for p in categories_in_turn(prompts, 4)] == ["0", "3", "5", "1"]
    assert len(categories_in_turn(prompts, 99)) == 6


# --- the method ---------------------------------------------------------------------------


def test_variant_drafts_each_category_with_its_own_setting(tiny_llama_dir):
    from autotune.methods.base import DraftEnv
    from autotune.models.ref import TargetRef

    ref = TargetRef.for_user(str(tiny_llama_dir))
    method = registry.get("ngram")
    settings = NgramSettings(draft=block_of(lookup()), by_category={"rag": block_of(suffix())})
    variant = method.variant(settings, DraftEnv(ref, ref.runner()))
    assert variant.make().policy == lookup()
    assert variant.by_category["rag"]().policy == suffix()
    assert method.exporters.keys() | method.cannot_export.keys() == {
        "vllm",
        "sglang",
        "trtllm",
        "hf",
        "llamacpp",
        "dv",
    }


def test_tune_on_a_tiny_llama_chooses_on_search_prompts(tmp_path, tiny_llama_dir, monkeypatch):
    """The whole ladder, without Ray (no study trials) and with a fixed verify curve: the
    setting is one of the two kinds' measured winners, and each category is judged."""
    from autotune.budget import Budget
    from autotune.methods.base import TuneContext
    from autotune.models.ref import TargetRef
    from autotune.studies.workers import Workers
    from autotune.workspace import Workspace

    lines = []
    for i in range(12):
        text = "abc abc abc abc abc" if i % 2 else f"tell me about {i}"
        lines.append(json.dumps({"prompt": text, "category": "copy" if i % 2 else "chat"}))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(lines) + "\n")
    ref = TargetRef.for_user(str(tiny_llama_dir))
    ws = Workspace.open(ref, prompts, f"sqlite:///{tmp_path / 'db.sqlite'}")
    ws.runner.eos_token_ids = frozenset()
    monkeypatch.setattr(
        ws,
        "verify_curve",
        lambda n, repeats=3: LatencyCurve([1e-3 * (1 + 0.03 * i) for i in range(n)]),
    )
    method = registry.get("ngram")
    overlay = tmp_path / "space.yaml"
    overlay.write_text(
        "calibration: {prompts: 4, tokens: 16}\nstudy: {trials: 0}\n"
        "trials: {prompts: 4, tokens: 12}\nsearch: {passes: 1, finalists: 1}\n"
    )
    ctx = TuneContext(ws, method.space(overlay), Budget(None), Workers())
    # the probe first, as a profile runs it: measured figures against greedy and a bound
    # no lower than what it measured
    found = method.probe(ctx)
    assert found is not None and found.measured is not None
    assert found.measured.prompts and found.measured.lossless
    assert found.bound.speedup >= found.measured.speedup
    assert found.measured.looks >= 2  # the fastest of several: the interval allows for it
    settings = method.tune(ctx)
    assert isinstance(settings, NgramSettings)
    assert settings.selection is not None and settings.selection.prompts
    chosen = settings.config()
    candidates = {
        k: NgramSettings(draft=v["draft"]).config() for k, v in settings.alternatives.items()
    }
    assert chosen in candidates.values() and {"ngram", "suffix"} <= set(candidates)
    rules = {f"{engine} rule" for engine in ("hf", "vllm", "trtllm", "llamacpp")}
    assert rules <= set(candidates) <= {"ngram", "suffix", "default", *rules}
    assert set(settings.by_category) <= {"copy", "chat"}
    judged = settings.search["side_by_side"]["categories"]
    assert set(judged) <= {"copy", "chat"} and judged
    assert all(set(settings.search["proxy"][k]) >= {"best", "predicted_speedup"} for k in KINDS)
    NgramSettings.model_validate(settings.model_dump())  # what the profile will hold
    # each engine's own setting, by its own rule, decoded against greedy
    assert set(settings.engines) == {"hf", "vllm", "trtllm", "llamacpp"}
    for engine, variant in settings.engines.items():
        served = method.for_engine(settings, engine).config()
        assert isinstance(served, EngineLookupConfig) and served.engine == engine
        assert variant.selection is not None and variant.selection.lossless
    # no time left: no side by side; the proxy's better kind, unmeasured, for the
    # held-back measurement to judge
    late = TuneContext(ws, method.space(overlay), Budget(0.0), Workers())
    hurried = method.tune(late)
    assert hurried.selection is None and hurried.config() in candidates.values()
    assert any("no time was left for the n-gram side by side" in n for n in late.notes)
    # --engine llamacpp: the search keeps to llama.cpp's rule from the probe on
    ctx = TuneContext(ws, method.space(overlay), Budget(None), Workers(), engines=("llamacpp",))
    probed = method.probe(ctx)
    assert probed is not None and "llamacpp" in probed.bound.evidence
    only = method.tune(ctx)
    assert only.config() == method.for_engine(only, "llamacpp").config()
    assert only.config().engine == "llamacpp" and set(only.engines) == {"llamacpp"}
    assert only.selection is not None and only.selection.lossless
    # and with no time left, its proxy's best, unmeasured
    late = TuneContext(ws, method.space(overlay), Budget(0.0), Workers(), engines=("llamacpp",))
    hurried = method.tune(late)
    assert hurried.config().engine == "llamacpp" and hurried.selection is None
    assert any("no time was left for the n-gram side by side" in n for n in late.notes)
