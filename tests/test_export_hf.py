"""The transformers export of a Draft & Verify profile: the early-exit rule a skip mask
maps to, the generation-config fragment, and the fragment run through transformers' own
generate on the embedded model, equal to plain greedy."""

from __future__ import annotations

import copy
import json

import pytest
from test_export import fixture, with_adaptive

from autotune.engine.skip import SkipMask
from autotune.export import export_profile
from autotune.methods.self_spec.export import early_exit_layer


def merged_with(config, settings: dict):
    """``config`` with ``settings`` merged in, as generation_config.json with them added."""
    merged = copy.deepcopy(config)
    merged.update(**settings)
    return merged


def test_early_exit_rule():
    # a suffix of whole layers is exactly an early exit
    assert early_exit_layer(SkipMask.of(range(20, 30), range(20, 30)), 30) == (20, True)
    # a scattered mask: the exit that runs as many sublayers as the mask keeps
    assert early_exit_layer(SkipMask.of([3, 5, 7], [4]), 30) == (28, False)
    assert early_exit_layer(SkipMask.of([3, 5, 7], []), 30) == (29, False)  # ceil(57 / 2)
    # held within [1, L - 1]
    assert early_exit_layer(SkipMask.of(range(30), range(30)), 30) == (1, False)
    assert early_exit_layer(SkipMask.of([29], []), 30) == (29, False)


def test_hf_fragment():
    profile = fixture("self_spec")
    spec = profile.methods.self_spec
    result = export_profile(profile, "hf")
    settings = json.loads(result.text)
    kept = 2 * 30 - len(spec.skip.attention) - len(spec.skip.mlp)
    assert settings == {
        "assistant_early_exit": (kept + 1) // 2,
        "num_assistant_tokens": spec.draft.max_tokens,
        "num_assistant_tokens_schedule": "constant",
        "assistant_confidence_threshold": spec.draft.exit_threshold,
    }
    assert any("approximates the skip mask" in w for w in result.warnings)
    assert any(
        "adaptive threshold" in w for w in export_profile(with_adaptive(profile), "hf").warnings
    )


def test_hf_exact_for_a_suffix_mask():
    profile = fixture("self_spec")
    spec = profile.methods.self_spec
    profile.methods.self_spec = spec.model_copy(
        update={
            "skip": spec.skip.model_copy(
                update={"attention": list(range(24, 30)), "mlp": list(range(24, 30))}
            ),
            "draft": spec.draft.model_copy(update={"adaptive": None}),
            "cape": None,
        }
    )
    result = export_profile(profile, "hf")
    assert json.loads(result.text)["assistant_early_exit"] == 24
    assert result.warnings == ()


def _release() -> tuple[int, ...]:
    """The installed transformers' (major, minor)."""
    import transformers

    return tuple(int(part) for part in transformers.__version__.split(".")[:2])


def test_hf_export_runs_in_transformers_and_equals_greedy(embedded_target, one_thread, monkeypatch):
    """transformers' own generate, given the fragment, drafts by early exit with exactly the
    exported settings, and its output is plain greedy: both as the model's generation config
    (the fragment merged into generation_config.json) and as the notes advise (the exit layer
    passed to generate(), which avoids transformers nesting the draft's own generate)."""
    import torch
    from transformers.generation import candidate_generator

    settings = json.loads(export_profile(fixture("self_spec"), "hf").text)
    seen = []
    original_init = candidate_generator.EarlyExitCandidateGenerator.__init__

    def spy(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        seen.append(
            {
                "assistant_early_exit": self.assistant_early_exit,
                "num_assistant_tokens": self.num_assistant_tokens,
                "assistant_confidence_threshold": self.assistant_confidence_threshold,
            }
        )

    monkeypatch.setattr(candidate_generator.EarlyExitCandidateGenerator, "__init__", spy)
    model = embedded_target.model
    ids = torch.tensor([embedded_target.encode_chat("Name three fruits.")])
    new_tokens = 12
    plain = model.generate(ids, do_sample=False, max_new_tokens=new_tokens)
    assert not seen  # plain greedy drafts nothing
    wanted = {
        k: settings[k]
        for k in ("assistant_early_exit", "num_assistant_tokens", "assistant_confidence_threshold")
    }
    own, layers = model.generation_config, model.config.num_hidden_layers
    # the note's known failures, merged: before 5.18 with a threshold above 0 (a TypeError),
    # and in 4.57 with any threshold (a ValueError)
    threshold = settings["assistant_confidence_threshold"]
    merged_fails = _release() < (5, 18) and (threshold > 0 or _release() == (4, 57))
    try:
        model.generation_config = merged_with(own, settings)
        if merged_fails:
            with pytest.raises((TypeError, ValueError)):
                model.generate(ids, do_sample=False, max_new_tokens=new_tokens)
            model.config.num_hidden_layers, merged = layers, plain  # see the finally
        else:
            merged = model.generate(ids, do_sample=False, max_new_tokens=new_tokens)
        assert seen[0] == wanted  # the outermost drafter: the export's
        seen.clear()
        rest = {k: v for k, v in settings.items() if k != "assistant_early_exit"}
        model.generation_config = merged_with(own, rest)
        advised = model.generate(
            ids,
            do_sample=False,
            max_new_tokens=new_tokens,
            assistant_early_exit=settings["assistant_early_exit"],
        )
        assert seen == [wanted]  # one drafter, no nesting
    finally:
        # transformers lowers the shared model's layer count while an early-exit draft
        # runs, and leaves it lowered when the draft fails: every later test would see it
        model.generation_config, model.config.num_hidden_layers = own, layers
    assert merged.tolist() == plain.tolist()
    assert advised.tolist() == plain.tolist()
    assert plain.shape[1] == ids.shape[1] + new_tokens
