"""The workspace's measurement cache: labelled timings, checked at one point before reuse."""

from __future__ import annotations

import json

import pytest

from autotune.models.ref import TargetRef
from autotune.workspace import Workspace

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def workspace(tmp_path, tiny_llama_dir, monkeypatch):
    monkeypatch.setenv("AUTOTUNE_CACHE", str(tmp_path / "cache"))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join(json.dumps({"prompt": f"p {i}", "category": "ab"[i % 2]}) + "\n" for i in range(8))
    )
    return Workspace.open(
        TargetRef.for_user(str(tiny_llama_dir)), prompts, f"sqlite:///{tmp_path / 'db.sqlite'}"
    )


def test_timings_are_labelled_and_reused_while_they_hold(workspace):
    built = []

    def build():
        built.append(1)
        return [0.010, 0.012]

    def not_in_this_run(value):
        raise AssertionError("a timing taken in this run is checked again")

    first = workspace.cached_measurement("latency", "k", build, spot_check=not_in_this_run)
    again = workspace.cached_measurement("latency", "k", build, spot_check=not_in_this_run)
    assert first == again == [0.010, 0.012] and len(built) == 1
    workspace._this_run.clear()  # the next run: the cached value is checked, and holds
    assert workspace.cached_measurement("latency", "k", build, spot_check=lambda v: 0.05) == first
    assert len(built) == 1
    stored = workspace._cache.get(
        "latency", workspace.target.fingerprint, next(iter(_keys(workspace))), "k"
    )
    assert stored["label"]["dtype"] == "float32" and stored["label"]["measured_at"]
    assert stored["label"]["machine"]["threads"] == workspace.hardware["threads"]
    # the spot check says the machine is 40% slower now: measured again
    workspace._this_run.clear()
    workspace.cached_measurement("latency", "k", build, spot_check=lambda v: 0.40)
    assert len(built) == 2


def test_an_unlabelled_timing_is_not_trusted(workspace):
    key = workspace.device_key()
    workspace._cache.put("latency", workspace.target.fingerprint, key, "old", [1.0, 2.0])
    assert workspace.cached_measurement("latency", "old", lambda: [3.0]) == [3.0]
    # what does not depend on the device keeps its old, unlabelled form
    workspace._cache.put("continuations", workspace.target.fingerprint, "any", "c", [[5, 6]])
    assert workspace.cached_measurement(
        "continuations", "c", lambda: [[7]], device_bound=False
    ) == [[5, 6]]


def test_prompts_keep_their_categories(workspace):
    encoded = workspace.encode(workspace.heldback_prompts())
    assert {p.category for p in encoded} == {"a", "b"}
    assert {p.id for p in encoded}.isdisjoint(p.id for p in workspace.search_prompts())


def _keys(workspace):
    yield workspace.device_key()


def test_a_prompt_longer_than_the_context_is_refused_by_name(workspace):
    from autotune.errors import PromptsFileError
    from autotune.prompts import Prompt

    context = workspace.target.model.config.max_position_embeddings
    workspace.check_context(16)  # the short ones fit
    workspace.prompts.append(Prompt("long", "word " * context))
    with pytest.raises(PromptsFileError) as refused:
        workspace.check_context(16)
    words = str(refused.value)
    assert "prompt 'long'" in words and f"({context} tokens less 80 for the answer" in words
    assert "shorten it or leave it out" in words
