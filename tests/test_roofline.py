"""The roofline: the floor arithmetic on stub numbers, the weights one forward streams,
`autotune latency --roofline`, and the floor ratio a profile records. No timing asserts."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from autotune.cli import app
from autotune.engine.runner import Runner
from autotune.measure import device_latency, roofline
from autotune.measure.costs import LatencyCurve
from autotune.measure.roofline import Roofline
from autotune.models import tiny

pytestmark = pytest.mark.usefixtures("one_thread")

# 1 GB at 10 GB/s: 0.1 s; 250 M params at 100 GFLOP/s: 5 ms a token; they meet at n = 20
STUB = Roofline(bandwidth=10e9, gemm_peak=100e9, weight_bytes=10**9, params=250 * 10**6)


def test_the_floor_is_the_memory_for_few_tokens_and_the_gemm_for_many():
    assert STUB.knee() == pytest.approx(20)
    assert STUB.floor(1) == pytest.approx(0.1)  # memory-bound
    assert STUB.floor(20) == pytest.approx(0.1)  # the crossing: both say 0.1 s
    assert STUB.floor(21) == pytest.approx(0.105)  # compute-bound past it
    assert STUB.floor(64) == pytest.approx(0.32)
    assert STUB.ratios([0.2, 0.1, 0.15]) == pytest.approx([2.0, 1.0, 1.5])
    assert "1000 MB / 10.0 GB/s" in STUB.formula() and "250.0 M params" in STUB.formula()


def test_a_profile_records_the_curve_relative_and_to_the_floor():
    record = roofline.verify_record(LatencyCurve([0.2, 0.25]), STUB)
    assert record["verify_cost_relative"] == [1.0, 1.25]
    assert record["verify_floor_ratio"] == [2.0, 2.5]
    assert record["roofline"] == {
        "bandwidth_gb_s": 10.0,
        "gemm_gflop_s": 100.0,
        "weight_mb": 1000.0,
        "params_m": 250.0,
    }


# The tiny LLaMA's Linear weights: 4 layers of q 64x64, k and v 64x32 (2 kv heads of 16),
# o 64x64, gate, up and down 64x128; and the lm_head, 128x64
LAYER_PARAMS = 64 * 64 * 2 + 64 * 32 * 2 + 64 * 128 * 3
TINY_LINEAR_PARAMS = 4 * LAYER_PARAMS + 128 * 64


def test_the_weights_streamed_are_the_linear_weights_lm_head_included(tiny_llama):
    runner = Runner(tiny_llama)
    linears = [m.weight for m in tiny_llama.modules() if isinstance(m, torch.nn.Linear)]
    assert roofline.linear_params(runner) == TINY_LINEAR_PARAMS  # not the embedding
    assert roofline.weight_bytes(runner) == sum(w.numel() * w.element_size() for w in linears)
    assert roofline.weight_bytes(runner) == 4 * TINY_LINEAR_PARAMS  # float32
    half = Runner(tiny.tiny_llama().to(torch.bfloat16))
    assert roofline.weight_bytes(half) == 2 * TINY_LINEAR_PARAMS


def test_a_lm_head_tied_to_the_embedding_counts_once():
    from transformers import LlamaForCausalLM

    config = tiny.tiny_llama().config
    config.tie_word_embeddings = True
    model = LlamaForCausalLM(config).eval()
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert roofline.linear_params(Runner(model)) == TINY_LINEAR_PARAMS


def test_the_measurements_are_rates():
    assert roofline.measure_bandwidth("cpu", 16 * 2**20) > 0
    assert roofline.measure_gemm_peak("cpu", torch.float32, 64) > 0
    measured = roofline.measure_roofline(Runner(tiny.tiny_llama()), quick=True)
    assert measured.weight_bytes == 4 * TINY_LINEAR_PARAMS and measured.floor(1) > 0


# --- autotune latency --roofline ----------------------------------------------------------


@pytest.fixture
def quick_roofline(monkeypatch):
    # the profile's sizes: the CLI's 1 GiB stream is not what these tests are about
    monkeypatch.setattr(
        device_latency, "measure_roofline", lambda r: roofline.measure_roofline(r, quick=True)
    )


def latency(*args: str) -> str:
    result = CliRunner().invoke(app, ["latency", "--model", "tiny-arch", "--random-weights", *args])
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    return result.stdout


def rows(text: str) -> dict[str, list[str]]:
    """Rich table body rows, keyed by their first cell."""
    cells = ([c.strip() for c in line.split("│")[1:-1]] for line in text.splitlines())
    return {row[0]: row for row in cells if row and row[0]}


@pytest.mark.usefixtures("tiny_alias", "quick_roofline")
def test_latency_roofline_prints_the_floor_beside_the_curve():
    out = latency("--roofline", "--max-tokens", "4")
    assert "floor ms" in out and "x floor" in out
    assert "floor = max(" in out and "GB/s" in out and "GFLOP/s" in out
    table = rows(out)
    assert set(table) >= {"1", "2", "3", "4"} and "5" not in table
    assert all(len(table[n]) == 5 for n in "1234")


@pytest.mark.usefixtures("tiny_alias", "quick_roofline")
def test_latency_roofline_json_has_the_floor_and_times_a_grid_past_16():
    data = json.loads(latency("--roofline", "--max-tokens", "20", "--json"))
    assert len(data["seconds"]) == 20
    assert data["timed"] == [*range(1, 17), 20]  # 17 to 19 interpolated
    floor = data["roofline"]
    # tiny-arch: 2 layers of the tiny LLaMA's shapes and its lm_head, in float32
    assert floor["params"] == TINY_LINEAR_PARAMS - 2 * LAYER_PARAMS
    assert floor["weight_bytes"] == 4 * floor["params"]
    assert floor["bandwidth"] > 0 and floor["gemm_peak"] > 0
    assert {"bandwidth_gb_s", "gemm_gflop_s", "weight_mb", "params"} <= set(floor)
    assert len(floor["floor_ms"]) == 20 and len(floor["x_floor"]) == 20
    assert all(f > 0 for f in floor["floor_ms"]) and all(r > 0 for r in floor["x_floor"])
    # the table shows only the sizes timed
    table = rows(latency("--roofline", "--max-tokens", "18"))
    assert set(table) >= {"16", "18"} and "17" not in table


@pytest.mark.usefixtures("tiny_alias", "quick_roofline")
def test_latency_without_roofline_is_as_before():
    data = json.loads(latency("--max-tokens", "2", "--json"))
    assert data["roofline"] is None and data["timed"] == [1, 2]
    assert "floor" not in latency("--max-tokens", "2")


# --- the profile ---------------------------------------------------------------------------


def test_the_workspace_measures_its_roofline_once_a_run(tmp_path, tiny_llama_dir, monkeypatch):
    from autotune.models.ref import TargetRef
    from autotune.workspace import Workspace

    monkeypatch.setenv("AUTOTUNE_CACHE", str(tmp_path / "cache"))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "p", "category": "a"}) + "\n")
    ws = Workspace.open(
        TargetRef.for_user(str(tiny_llama_dir)), prompts, f"sqlite:///{tmp_path / 'db.sqlite'}"
    )
    calls = []
    real = roofline.measure_roofline

    def counting(runner, quick=False):
        calls.append(quick)
        return real(runner, quick)

    monkeypatch.setattr("autotune.workspace.measure_roofline", counting)
    first = ws.verify_record(LatencyCurve([0.02, 0.03]))
    again = ws.verify_record(LatencyCurve([0.02, 0.03]))
    assert calls == [True]  # the quick sizes, once
    assert first == again and len(first["verify_floor_ratio"]) == 2
    assert first["verify_cost_relative"] == [1.0, 1.5]
    assert ws.roofline().weight_bytes == 4 * TINY_LINEAR_PARAMS
