"""Draft traces on the tiny model, the skip-mask and draft-exit parameterisations, and the
search-space YAML."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from autotune.drafters.self_spec import AdaptiveExit, DraftExitPolicy
from autotune.engine.decoding import decode_plain
from autotune.engine.runner import Runner
from autotune.engine.skip import NO_SKIP, SkipMask
from autotune.errors import AutotuneError
from autotune.measure.draft_trace import DraftTracer
from autotune.tuners import draft_exit, skip_mask
from autotune.tuners.space import (SEARCH_SPACES, DraftExitSpace, SkipMaskSpace,
                                   load_self_spec_space)


pytestmark = pytest.mark.usefixtures("one_thread")


PROMPTS = [[1, 5, 9, 33, 70], [1, 100, 3, 4], [1, 40, 41, 42, 43, 44]]


@pytest.fixture
def calibration(tiny_llama):
    runner = Runner(tiny_llama)
    runner.eos_token_ids = frozenset()  # full-length continuations
    sequences = [(p, decode_plain(runner, p, 24).tokens) for p in PROMPTS]
    return runner, sequences


# --- draft traces --------------------------------------------------------------------

def match_rate(traces) -> float:
    return sum(int(t.matches.sum()) for t in traces) / sum(len(t.matches) for t in traces)


def test_trace_without_skip_matches_the_target(calibration):
    runner, sequences = calibration
    traces = DraftTracer(runner, sequences).traces(NO_SKIP)
    assert len(traces) == len(sequences)
    for t, (_, continuation) in zip(traces, sequences):
        assert len(t.matches) == len(continuation) == len(t.confidences)
        assert t.matches.dtype == np.bool_
        assert np.all((t.confidences > 0) & (t.confidences <= 1))
    assert match_rate(traces) >= 0.95


def test_skip_mask_lowers_or_keeps_match_rate(calibration):
    runner, sequences = calibration
    tracer = DraftTracer(runner, sequences)
    full = match_rate(tracer.traces(NO_SKIP))
    rates = {str(m): match_rate(tracer.traces(m)) for m in
             (SkipMask.of(mlp=[3]), SkipMask.of(attention=[1, 2]),
              SkipMask.of(attention=range(4), mlp=range(4)))}
    assert all(rate <= full for rate in rates.values())
    # skipping every sublayer leaves embeddings -> head: far from the target
    assert rates[str(SkipMask.of(attention=range(4), mlp=range(4)))] < full
    # tracing is repeatable (the tracer's cache is restored after each mask)
    assert match_rate(tracer.traces(NO_SKIP)) == full


@pytest.mark.parametrize("skip", [SkipMask.of(attention=[1, 2]), SkipMask.of(attention=[0],
                                                                              mlp=[2, 3])],
                         ids=str)
def test_trace_equals_one_draft_step_from_the_exact_context(calibration, skip):
    """Each trace entry is what the drafter sees when it drafts the first token of a
    step: the full model's cache of the prefix, then one skipped-layer forward."""
    runner, sequences = calibration
    prompt, continuation = sequences[0]
    (t,) = DraftTracer(runner, [(prompt, continuation)]).traces(skip)
    tokens = prompt + continuation[:-1]
    for j, position in enumerate(range(len(prompt) - 1, len(tokens))):
        cache = runner.new_cache()
        runner.forward(torch.tensor(tokens[:position]), torch.arange(position), cache)
        logits = runner.forward(torch.tensor([tokens[position]]), torch.tensor([position]), cache,
                                skip=skip).logits[-1]
        probs = torch.softmax(logits, dim=-1)
        assert bool(t.matches[j]) == (int(probs.argmax()) == continuation[j])
        assert t.confidences[j] == pytest.approx(float(probs.max()), abs=1e-4)


# --- skip-mask parameters ------------------------------------------------------------

def test_mask_params_round_trip():
    space = SkipMaskSpace()
    for num_layers in (4, 30):
        layers = space.skippable_layers(num_layers)
        mask = SkipMask.of(attention=layers[::2], mlp=layers[1::3])
        params = skip_mask.params_from_mask(mask, space, num_layers)
        assert len(params) == 2 * len(layers)
        assert set(params) == set(skip_mask.search_distributions(space, num_layers))
        assert skip_mask.mask_from_params(params) == mask
    params = skip_mask.params_from_mask(SkipMask.of(attention=[12], mlp=[7]), space, 30)
    assert params["attn_012"] == 1 and params["mlp_007"] == 1
    assert sum(params.values()) == 2


def test_search_distributions_cover_skippable_layers_only():
    space = SkipMaskSpace(keep_first=2, keep_last=3)
    names = set(skip_mask.search_distributions(space, 10))
    assert names == {f"{k}_{i:03d}" for k in ("attn", "mlp") for i in range(2, 7)}


def test_middle_attention_mask_30_layers():
    mask = skip_mask.middle_attention_mask(30)
    assert mask.mlp == frozenset()
    assert sorted(mask.attention) == list(range(9, 21))
    assert len(mask.attention) == 12


@pytest.mark.parametrize("num_layers", [4, 8, 16, 30, 40])
def test_seed_masks_lie_within_budget(num_layers):
    space = SkipMaskSpace()
    seeds = skip_mask.seed_masks(space, num_layers)
    assert seeds, "no warm start at all"
    assert len(set(seeds)) == len(seeds)
    for seed in seeds:
        assert seed.size > 0
        assert space.min_skip_ratio <= seed.ratio(num_layers) <= space.max_skip_ratio


def test_seed_masks_respect_a_narrow_budget():
    space = SkipMaskSpace(min_skip_ratio=0.15, max_skip_ratio=0.25)
    for seed in skip_mask.seed_masks(space, 30):
        assert 0.15 <= seed.ratio(30) <= 0.25


@pytest.mark.parametrize("num_layers,keep", [
    (30, 1), (30, 3), (8, 2), (40, 5),
    (30, 10),
])
def test_seed_masks_lie_within_the_search_space(num_layers, keep):
    space = SkipMaskSpace(keep_first=keep, keep_last=keep, min_skip_ratio=0.05)
    layers = set(space.skippable_layers(num_layers))
    seeds = skip_mask.seed_masks(space, num_layers)
    assert seeds
    for seed in seeds:
        assert seed.attention | seed.mlp <= layers, str(seed)
        # a seed goes to the study as parameters: it must come back unchanged
        assert skip_mask.mask_from_params(
            skip_mask.params_from_mask(seed, space, num_layers)) == seed


# --- draft-exit parameters -----------------------------------------------------------

@pytest.mark.parametrize("policy", [
    DraftExitPolicy(4, 0.6, AdaptiveExit(0.8, 0.02, 0.5, 0.9)),
    DraftExitPolicy(1, 0.0, None),
    DraftExitPolicy(8, 0.95, AdaptiveExit(0.5, 0.001, 0.3, 0.5)),
])
def test_draft_exit_params_round_trip(policy):
    space = DraftExitSpace()
    params = draft_exit.params_from_policy(policy, space)
    assert set(params) == set(draft_exit.search_distributions(space))
    assert params["adaptive"] is (policy.adaptive is not None)
    for name, dist in draft_exit.search_distributions(space).items():
        assert dist._contains(dist.to_internal_repr(params[name])), name
    assert draft_exit.policy_from_params(params) == policy


def test_draft_exit_params_are_clipped_to_the_space():
    space = DraftExitSpace()
    params = draft_exit.params_from_policy(DraftExitPolicy(12, 0.99, AdaptiveExit(0.99, 0.5,
                                                                                  0.1, 0.99)),
                                           space)
    assert params["max_tokens"] == 8 and params["exit_threshold"] == 0.95
    assert params["target_acceptance"] == 0.95 and params["step"] == 0.05
    assert params["beta1"] == 0.3 and params["beta2"] == 0.95


def test_policy_from_params_without_adaptive():
    params = {"max_tokens": 3, "exit_threshold": 0.4, "adaptive": False,
              "target_acceptance": 0.7, "step": 0.01, "beta1": 0.5, "beta2": 0.9}
    assert draft_exit.policy_from_params(params) == DraftExitPolicy(3, 0.4, None)


# --- search space YAML ---------------------------------------------------------------

def test_default_space_loads_the_shipped_yaml():
    assert (SEARCH_SPACES / "self_spec.yaml").is_file()
    space = load_self_spec_space()
    assert 0 <= space.skip_mask.min_skip_ratio < space.skip_mask.max_skip_ratio <= 1
    assert space.skip_mask.sampler in ("gp", "skopt")
    assert space.draft_exit.trials >= 1 and space.calibration.tokens >= 1
    # the file's own values, not the model defaults
    import yaml
    raw = yaml.safe_load((SEARCH_SPACES / "self_spec.yaml").read_text())
    assert space.skip_mask.trials == raw["skip_mask"]["trials"]
    assert space.measure.confirm_tokens == raw["measure"]["confirm_tokens"]
    assert list(space.skip_mask.max_tokens_choices) == raw["skip_mask"]["max_tokens_choices"]


def test_space_partial_file_uses_defaults(tmp_path):
    path = tmp_path / "space.yaml"
    path.write_text("calibration: {prompts: 2, tokens: 12}\ndraft_exit: {trials: 2}\n")
    space = load_self_spec_space(path)
    assert space.calibration.prompts == 2 and space.calibration.tokens == 12
    assert space.draft_exit.trials == 2
    assert space.skip_mask == SkipMaskSpace()


@pytest.mark.parametrize("text,words", [
    ("skip_mask: {min_skip_ratio: 0.8, max_skip_ratio: 0.2}\n", "min_skip_ratio"),
    ("skip_mask: {sampler: random}\n", "sampler"),
    ("skip_mask: {trials: 5, unknown_knob: 1}\n", "unknown_knob"),
    ("measure: {search_prompts: many}\n", "search_prompts"),
    ("skip_mask: [1, 2\n", "invalid"),
])
def test_invalid_space_raises_autotune_error(tmp_path, text, words):
    path = tmp_path / "space.yaml"
    path.write_text(text)
    with pytest.raises(AutotuneError) as err:
        load_self_spec_space(path)
    message = str(err.value)
    assert str(path) in message and words in message
    assert "\n" not in message


def test_missing_space_file_raises_autotune_error(tmp_path):
    with pytest.raises(AutotuneError, match="not found"):
        load_self_spec_space(tmp_path / "nope.yaml")
