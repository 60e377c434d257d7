"""Draft traces on the tiny model, the skip-mask and draft-exit parameterisations, and the
search spaces' YAML (packaged defaults, user files laid over them)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from autotune.drafters.self_spec import AdaptiveExit, DraftExitPolicy
from autotune.engine.decoding import decode_plain
from autotune.engine.runner import Runner
from autotune.engine.skip import NO_SKIP, SkipMask
from autotune.errors import AutotuneError
from autotune.measure.draft_trace import DraftTracer
from autotune.methods import registry
from autotune.methods.self_spec import trials
from autotune.tuners import skip_mask

SELF_SPEC = registry.get("self_spec")


def mask_space(**changes):
    return SELF_SPEC.space().skip_mask.model_copy(update=changes)


def exit_space():
    return SELF_SPEC.space().draft_exit


def seeds(space, num_layers):
    return skip_mask.seed_masks(
        space.skippable_layers(num_layers), num_layers, space.min_skip_ratio, space.max_skip_ratio
    )


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
    rates = {
        str(m): match_rate(tracer.traces(m))
        for m in (
            SkipMask.of(mlp=[3]),
            SkipMask.of(attention=[1, 2]),
            SkipMask.of(attention=range(4), mlp=range(4)),
        )
    }
    assert all(rate <= full for rate in rates.values())
    # skipping every sublayer leaves embeddings -> head: far from the target
    assert rates[str(SkipMask.of(attention=range(4), mlp=range(4)))] < full
    # tracing is repeatable (the tracer's cache is restored after each mask)
    assert match_rate(tracer.traces(NO_SKIP)) == full


@pytest.mark.parametrize(
    "skip", [SkipMask.of(attention=[1, 2]), SkipMask.of(attention=[0], mlp=[2, 3])], ids=str
)
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
        logits = runner.forward(
            torch.tensor([tokens[position]]), torch.tensor([position]), cache, skip=skip
        ).logits[-1]
        probs = torch.softmax(logits, dim=-1)
        assert bool(t.matches[j]) == (int(probs.argmax()) == continuation[j])
        assert t.confidences[j] == pytest.approx(float(probs.max()), abs=1e-4)


# --- skip-mask parameters ------------------------------------------------------------


def test_mask_params_round_trip():
    space = mask_space()
    for num_layers in (4, 30):
        layers = space.skippable_layers(num_layers)
        mask = SkipMask.of(attention=layers[::2], mlp=layers[1::3])
        params = trials.params_from_mask(mask, space, num_layers)
        assert len(params) == 2 * len(layers)
        assert set(params) == set(trials.mask_distributions(space, num_layers))
        assert trials.mask_from_params(params) == mask
    params = trials.params_from_mask(SkipMask.of(attention=[12], mlp=[7]), space, 30)
    assert params["attn_012"] == 1 and params["mlp_007"] == 1
    assert sum(params.values()) == 2


def test_search_distributions_cover_skippable_layers_only():
    space = mask_space(keep_first=2, keep_last=3)
    names = set(trials.mask_distributions(space, 10))
    assert names == {f"{k}_{i:03d}" for k in ("attn", "mlp") for i in range(2, 7)}


def test_middle_attention_mask_30_layers():
    mask = skip_mask.middle_attention_mask(30)
    assert mask.mlp == frozenset()
    assert sorted(mask.attention) == list(range(9, 21))
    assert len(mask.attention) == 12


@pytest.mark.parametrize("num_layers", [4, 8, 16, 30, 40])
def test_seed_masks_lie_within_budget(num_layers):
    space = mask_space()
    found = seeds(space, num_layers)
    assert found, "no warm start at all"
    assert len(set(found)) == len(found)
    for seed in found:
        assert seed.size > 0
        assert space.min_skip_ratio <= seed.ratio(num_layers) <= space.max_skip_ratio


def test_seed_masks_respect_a_narrow_budget():
    space = mask_space(min_skip_ratio=0.15, max_skip_ratio=0.25)
    for seed in seeds(space, 30):
        assert 0.15 <= seed.ratio(30) <= 0.25


@pytest.mark.parametrize(
    "num_layers,keep",
    [
        (30, 1),
        (30, 3),
        (8, 2),
        (40, 5),
        (30, 10),
    ],
)
def test_seed_masks_lie_within_the_search_space(num_layers, keep):
    space = mask_space(keep_first=keep, keep_last=keep, min_skip_ratio=0.05)
    layers = set(space.skippable_layers(num_layers))
    found = seeds(space, num_layers)
    assert found
    for seed in found:
        assert seed.attention | seed.mlp <= layers, str(seed)
        # a seed goes to the study as parameters: it must come back unchanged
        assert trials.mask_from_params(trials.params_from_mask(seed, space, num_layers)) == seed


# --- draft-exit parameters -----------------------------------------------------------


@pytest.mark.parametrize(
    "policy",
    [
        DraftExitPolicy(4, 0.6, AdaptiveExit(0.8, 0.02, 0.5, 0.9)),
        DraftExitPolicy(1, 0.0, None),
        DraftExitPolicy(8, 0.95, AdaptiveExit(0.5, 0.001, 0.3, 0.5)),
    ],
)
def test_draft_exit_params_round_trip(policy):
    space = exit_space()
    params = trials.params_from_policy(policy, space)
    assert set(params) == set(trials.exit_distributions(space))
    assert params["adaptive"] is (policy.adaptive is not None)
    for name, dist in trials.exit_distributions(space).items():
        assert dist._contains(dist.to_internal_repr(params[name])), name
    assert trials.policy_from_params(params) == policy


def test_draft_exit_params_are_clipped_to_the_space():
    space = exit_space()
    params = trials.params_from_policy(
        DraftExitPolicy(12, 0.99, AdaptiveExit(0.99, 0.5, 0.1, 0.99)), space
    )
    assert params["max_tokens"] == 8 and params["exit_threshold"] == 0.95
    assert params["target_acceptance"] == 0.95 and params["step"] == 0.05
    assert params["beta1"] == 0.3 and params["beta2"] == 0.95


def test_policy_from_params_without_adaptive():
    params = {
        "max_tokens": 3,
        "exit_threshold": 0.4,
        "adaptive": False,
        "target_acceptance": 0.7,
        "step": 0.01,
        "beta1": 0.5,
        "beta2": 0.9,
    }
    assert trials.policy_from_params(params) == DraftExitPolicy(3, 0.4, None)


# --- search space YAML ---------------------------------------------------------------


def test_default_space_is_the_packaged_yaml():
    import yaml

    from autotune.methods.base import packaged_space_text

    space = SELF_SPEC.space()
    raw = yaml.safe_load(packaged_space_text(SELF_SPEC))
    assert space.skip_mask.trials == raw["skip_mask"]["trials"]
    assert space.trials.tokens == raw["trials"]["tokens"]
    assert list(space.skip_mask.max_tokens_choices) == raw["skip_mask"]["max_tokens_choices"]
    assert space.skip_mask.sampler in ("gp", "skopt")


@pytest.mark.parametrize("name", ["self_spec", "medusa", "eagle", "cape"])
def test_every_method_has_a_complete_packaged_space(name):
    """The models have no defaults: the YAML alone must validate (one source of defaults)."""
    entry = registry.get(name)
    assert entry.space() is not None
    with pytest.raises(ValidationError):
        entry.space_model.model_validate({})


def test_a_partial_user_file_lies_over_the_packaged_space(tmp_path):
    path = tmp_path / "space.yaml"
    path.write_text("calibration: {prompts: 2, tokens: 12}\ndraft_exit: {trials: 2}\n")
    space = SELF_SPEC.space(path)
    assert space.calibration.prompts == 2 and space.calibration.tokens == 12
    assert space.draft_exit.trials == 2
    assert space.draft_exit.max_tokens == SELF_SPEC.space().draft_exit.max_tokens
    assert space.skip_mask == SELF_SPEC.space().skip_mask


@pytest.mark.parametrize(
    "text,words",
    [
        ("skip_mask: {min_skip_ratio: 0.8, max_skip_ratio: 0.2}\n", "min_skip_ratio"),
        ("skip_mask: {sampler: random}\n", "sampler"),
        ("skip_mask: {trials: 5, unknown_knob: 1}\n", "unknown_knob"),
        ("trials: {prompts: many}\n", "prompts"),
        ("skip_mask: [1, 2\n", "YAML"),
        ("[1, 2]\n", "mapping"),
    ],
)
def test_invalid_space_raises_autotune_error(tmp_path, text, words):
    path = tmp_path / "space.yaml"
    path.write_text(text)
    with pytest.raises(AutotuneError) as err:
        SELF_SPEC.space(path)
    message = str(err.value)
    assert str(path) in message and words in message
    assert "\n" not in message


def test_missing_space_file_raises_autotune_error(tmp_path):
    with pytest.raises(AutotuneError, match="not found"):
        SELF_SPEC.space(tmp_path / "nope.yaml")
