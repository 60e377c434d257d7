"""The profile's answers phase: the shared self-distillation set filled within its time,
most needed first, read back by every tuner's calibration and every head trainer, and
head kinds that cannot be trained usefully in the time planned dropped from the plan."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from autotune import workspace
from autotune.engine.runner import Runner
from autotune.prompts import load_prompts, split_prompts
from autotune.training import calibration, distill, job
from autotune.workspace import Workspace

pytestmark = pytest.mark.usefixtures("one_thread")

WORDS = [f"topic {i}" for i in range(24)]


@pytest.fixture
def workload(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOTUNE_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "prompts.jsonl"
    path.write_text(
        "".join(json.dumps({"prompt": f"Tell me about {w}.", "id": w}) + "\n" for w in WORDS)
    )
    return path, load_prompts(path)


def test_the_answers_phase_stops_when_the_next_chunk_would_not_fit(tiny_target, workload):
    path, prompts = workload
    # the first chunk always runs (every method calibrates on it); then the time is gone
    runner = Runner(tiny_target.model)
    answered = calibration.decode_calibration(tiny_target, runner, path, prompts, 8, seconds=1e-3)
    extras = answered.extras
    assert extras == []  # no calibration prompt from the packaged files fitted
    search = split_prompts(prompts)[0]
    trained = calibration.heads_split(search)
    reported = [p for p in search if p not in trained]
    first = [p for pair in zip(reported, trained) for p in pair]
    first = (first + trained[len(reported) :])[: distill.GENERATION_BATCH]
    cache = calibration.answer_cache(tiny_target.fingerprint)
    known = cache.load([tiny_target.encode_chat(p.text) for p in search], 8)
    decoded = {p.id for p, k in zip(search, known) if k is not None}
    assert decoded == {p.id for p in first}
    # the time ledger says what the phase bought: the search prompts' answers it decoded
    assert answered.text() == f"answers to {len(first)} search prompts"
    # the trainers take what was decoded, and nothing else
    keep = calibration.answered(tiny_target, 8)
    _, train_on, reported, _ = job.training_lists(prompts, extras, keep)
    assert {p.id for p in train_on} <= decoded and {p.id for p in reported} <= decoded
    assert reported, "the search prompts the heads do not train on come first"
    assert not {p.id for p in reported} & {p.id for p in trained}


def test_a_first_chunk_that_cannot_fit_is_cut_to_its_least(tiny_target, workload, monkeypatch):
    path, prompts = workload
    monkeypatch.setattr(
        calibration, "_process_rate", lambda fingerprint: calibration._Rate()
    )  # none yet
    # at an estimated 10 s an answer none fits: the least, 3, is decoded (not the 16 of a
    # first chunk), and then the time is gone
    calibration.decode_calibration(
        tiny_target,
        Runner(tiny_target.model),
        path,
        prompts,
        8,
        seconds=1e-3,
        extras=False,
        first_estimate=(10.0, 3),
    )
    search = split_prompts(prompts)[0]
    known = calibration.answer_cache(tiny_target.fingerprint).load(
        [tiny_target.encode_chat(p.text) for p in search], 8
    )
    assert sum(k is not None for k in known) == 3


def test_tuners_calibrate_on_the_shared_answers(tiny_target, workload, monkeypatch):
    ids = [tiny_target.encode_chat(f"Say {w}.") for w in WORDS[:5]]
    prompts = [SimpleNamespace(ids=i) for i in ids]
    real = distill.decode_answers
    ws = SimpleNamespace(target=tiny_target, runner=Runner(tiny_target.model), decode_missing=True)
    first = Workspace.continuations(ws, prompts, 10)  # type: ignore[arg-type]
    # the engine's batched answers are each prompt's own greedy answer, as it is decoded
    # alone (the engine's against transformers' generate: tests/test_engine.py)
    alone = distill.greedy_answers(tiny_target.model, ids, 10, batch_size=1)
    assert [c for _, c in first] == [a.tokens for a in alone if len(a.tokens) > 1]

    def no_decoding(*args, **kwargs):
        raise AssertionError("decoded again")

    monkeypatch.setattr(distill, "decode_answers", no_decoding)
    # a shorter continuation is the kept answer's prefix: read back, not decoded
    again = Workspace.continuations(ws, prompts, 6)  # type: ignore[arg-type]
    assert [c for _, c in again] == [c[:6] for _, c in first if len(c[:6]) > 1]
    # after a profile's answers phase: new prompts are decoded only up to the least
    monkeypatch.setattr(distill, "decode_answers", counting := Counting(real))
    monkeypatch.setattr(workspace, "CALIBRATION_LEAST", 6)
    ws.decode_missing = False
    more = [SimpleNamespace(ids=tiny_target.encode_chat(f"Say {w}.")) for w in WORDS[5:8]]
    Workspace.continuations(ws, prompts + more, 6)  # type: ignore[arg-type]
    assert counting.prompts == [more[0].ids]


class Counting:
    def __init__(self, decode):
        self.decode, self.prompts = decode, []

    def __call__(self, runner, prompts, *args, **kwargs):
        self.prompts += prompts
        return self.decode(runner, prompts, *args, **kwargs)
