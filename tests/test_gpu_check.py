"""The GPU check's parts that run without a GPU (benchmarks/gpu/, issue 40 item 3): what it
lists as missing, how bundle.py cuts the bundle into carries and check.py puts it back,
the graph reference on a tiny random LLaMA on the CPU, and the closing table of bars.
Nothing is downloaded: the wheels and the model here are made-up files."""

from __future__ import annotations

import argparse
import importlib
import json
import zipfile
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
MIB = 2**20


@pytest.fixture
def gpu(monkeypatch):
    """The check's modules, imported as check.py imports them (its folder on the path)."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks" / "gpu"))
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    names = ("bundle", "check_stage", "check_summary", "check_steps", "check", "hf_graph_reference")
    return type("Modules", (), {name: importlib.import_module(name) for name in names})


# --- what is missing -----------------------------------------------------------------------


def test_unmet_lists_missing_and_wrong_versions_and_extras_of_a_fake_environment(gpu):
    installed = {"typer": "0.9.0", "ray": "2.60.0", "torch": "2.11.0", "pandas": "2.3.0"}
    extras = {"ray": ["pandas; extra == 'tune'", "tensorboardX>=1.9; extra == 'tune'"]}
    requirements = [
        "torch>=2.5",
        "typer>=0.12",
        "optuna>=4.2,<6",
        "ray[tune]>=2.40,<3",
        "psycopg[binary]>=3.1",  # PostgreSQL only: not listed
        "pywin32>=300; sys_platform == 'win32'",  # not for this machine
    ]
    found = gpu.check_stage.unmet(requirements, installed, lambda name, _: extras.get(name, []))
    lines = [u.line() for u in found]
    assert lines == [
        "wrong version: typer 0.9.0 installed, typer>=0.12 needed",
        "missing: optuna<6,>=4.2",
        "missing: tensorboardX>=1.9",
    ]
    assert [u.name for u in found] == ["typer", "optuna", "tensorboardx"]


def test_protected_pins_hold_torch_transformers_and_cuda_packages(gpu):
    installed = {"torch": "2.11.0", "transformers": "5.17.0", "nvidia-cublas": "13.1", "rich": "14"}
    pins = gpu.check_stage.protected_pins(installed)
    assert pins == ["nvidia-cublas==13.1", "torch==2.11.0", "transformers==5.17.0"]


# --- the bundle in carries -----------------------------------------------------------------


def test_carries_fit_their_limit_wheels_first_and_the_model_in_order(gpu):
    wheels = [("ray.whl", 45 * MIB), ("optuna.whl", MIB // 2), ("sqlalchemy.whl", 4 * MIB)]
    capacity = 60 * MIB
    plan = gpu.bundle.plan_carries(wheels, 94 * MIB, capacity)
    assert len(plan) == 3
    assert all(sum(p.size for p in carry) <= capacity for carry in plan)
    assert {p.name for p in plan[0] if p.kind == "wheel"} == {n for n, _ in wheels}
    parts = [p for carry in plan for p in carry if p.kind == "model"]
    assert [p.name for p in parts] == ["model.part1", "model.part2", "model.part3"]
    assert [p.offset for p in parts] == [0, parts[0].size, parts[0].size + parts[1].size]
    assert sum(p.size for p in parts) == 94 * MIB


def test_a_wheel_larger_than_a_carry_is_one_line_of_error(gpu):
    with pytest.raises(gpu.bundle.BundleError, match=r"^ray\.whl is 70\.0 MiB, more than"):
        gpu.bundle.plan_carries([("ray.whl", 70 * MIB)], None, 60 * MIB)


def test_a_slimmed_wheel_drops_the_jar_and_lists_only_what_it_holds(gpu, tmp_path):
    wheel = tmp_path / "ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl"
    files = {"ray/__init__.py": b"x = 1\n", "ray/jars/ray_dist.jar": b"\0" * 1000}
    record = "".join(f"{name},sha256=abc,{len(data)}\n" for name, data in files.items())
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
        archive.writestr("ray-2.60.0.dist-info/RECORD", record + "ray-2.60.0.dist-info/RECORD,,\n")
    slim = gpu.bundle.slimmed(wheel, "ray/jars/", tmp_path / "slim")
    with zipfile.ZipFile(slim) as archive:
        names = archive.namelist()
        listed = archive.read("ray-2.60.0.dist-info/RECORD").decode().splitlines()
    assert names == ["ray/__init__.py", "ray-2.60.0.dist-info/RECORD"]
    assert [line.split(",")[0] for line in listed] == names


def test_carries_staged_over_calls_give_the_model_back_whole(gpu, tmp_path):
    """bundle.py's carries, staged one call at a time as check.py stages them: the model
    is put together only once its last part is here, and is the file it was."""
    wheel = tmp_path / "w" / "optuna-5.0.0-py3-none-any.whl"
    wheel.parent.mkdir()
    wheel.write_bytes(b"wheel" * 1000)
    model = tmp_path / "m.gguf"
    model.write_bytes(bytes(range(256)) * 20_000)  # 5 MB: parts of at least 1 MiB
    wheels = [(wheel.name, wheel.stat().st_size)]
    plan = gpu.bundle.plan_carries(wheels, model.stat().st_size, 2 * MIB)
    bundle, state = tmp_path / "bundle", tmp_path / "state"
    folders = gpu.bundle.write_carries(bundle, plan, {wheel.name: wheel}, model)
    described = gpu.bundle.manifest(folders, model, ["optuna==5.0.0"], {})
    for folder in folders:
        (folder / "manifest.json").write_text(json.dumps(described))
    assert len(folders) == 3
    call = tmp_path / "call"
    call.mkdir()
    for index, folder in enumerate(folders):
        carried = call / folder.name  # what one call of the device tool carries
        folder.rename(carried)
        staged = gpu.check_stage.stage(call, state)
        carried.rename(folder)
        whole = gpu.check_stage.assemble_model(staged)
        assert (whole is None) == (index < len(folders) - 1)
    assert staged.carries_missing() == []
    assert whole.read_bytes() == model.read_bytes()


def test_carries_of_two_bundles_are_refused(gpu, tmp_path):
    for index, bundle_id in enumerate(("aaaa", "bbbb"), start=1):
        folder = tmp_path / f"carry{index}"
        folder.mkdir()
        manifest = {"format": gpu.check_stage.FORMAT, "id": bundle_id, "files": []}
        (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(gpu.check_stage.CheckError, match="2 different bundles"):
        gpu.check_stage.stage(tmp_path, tmp_path / "state")


# --- the graph reference on a CPU ----------------------------------------------------------


def test_graph_reference_times_the_tiny_model_on_cpu_without_compiling(gpu, tiny_alias, tmp_path):
    out = tmp_path / "ref.json"
    arguments = ["--model", tiny_alias, "--random-weights", "--device", "cpu", "--dtype", "float32"]
    arguments += ["--sizes", "1,4", "--repeats", "2", "--context", "16", "--out", str(out)]
    assert gpu.hf_graph_reference.main(arguments) == 0
    result = json.loads(out.read_text())
    assert result["compiled"] is False and "no CUDA graphs" in result["graph"]
    for size in ("1", "4"):
        assert result["sizes"][size]["eager_dynamic_ms"] > 0
        assert result["sizes"][size]["static_eager_ms"] > 0
    # the static cache, rewound between forwards, computes the model: as one forward does
    assert result["relative_difference"]["4"] < 1e-5
    assert result["left_out"] == []


# --- the closing table ---------------------------------------------------------------------


def made_up_results(
    x_floor_1: float, graph_ms_1: float, greedy: float, over_default: float = 1.3
) -> dict:
    """Results as check.py records them, with the numbers that decide four bars."""
    seconds = [0.0100, 0.0110, 0.0120, 0.0130]
    profile = {
        "device": "cuda:0",
        "recommended": "eagle",
        "measured": {"speedup": 2.3, "speedup_interval": [1.8, 2.7], "lossless": True},
        "studies": ["eagle", "ngram"],
        "heads_trained": ["eagle"],
        "training_s": 40.0,
    }
    return {
        "environment": {"status": "ok", "data": {"device_name": "NVIDIA H100 80GB HBM3",
                                                 "torch": "2.11.0", "cuda": "13.0",
                                                 "date": "2026-11-27", "commit": "abc123"}},
        "latency": {"status": "ok", "data": {
            "seconds": seconds, "timed": [1, 2, 4],
            "roofline": {"x_floor": [x_floor_1, 1.2, 1.3, 1.4], "floor_ms": [8.0, 8.1, 8.2, 8.3]},
        }},
        "hf_reference": {"status": "ok", "data": {"sizes": {"1": {"graph_ms": graph_ms_1}}}},
        "greedy": {"status": "ok", "data": {
            "engine_tokens_per_s": greedy, "transformers_tokens_per_s": 500.0,
            "engine_over_transformers": greedy / 500, "interval": [1.1, 1.4],
            "transformers": "generate, StaticCache, compiled", "compiled": True,
            "decode_step_us": 1510.0, "step_replay_us": 1390.4, "around_step_us": 119.6,
            "prefill_tokens": 180, "prefill_parts_ms": 4.2, "prefill_eager_ms": 11.5,
            "prefill_in_parts": True,
        }},
        "tests": {"status": "ok", "data": {"passed": 57, "failed": 0, "device": "cuda"}},
        "graph_step": {"status": "ok", "data": {"columns": {
            "eager": {"ms": {"1": 17.7, "64": 23.5}}, "cuda-graph": {"ms": {"1": 8.85, "64": 20.0}},
            "compile": {"skipped": "failed: no compiler"},
        }}},
        "profile": {"status": "ok", "seconds": 170.0, "budget_s": 180, "returncode": 0,
                    "gpus_per_trial": 1, "data": {"profile": profile}},
        "against_defaults": {"status": "ok", "data": {
            "method": "eagle", "defaults": ["default: eagle1_tree", "default: eagle2_60_5_10"],
            "no_default": None, "prompts": 8,
            "variants": {"eagle": {"speedup": 2.3, "lossless": True}},
            "ratio": {"value": over_default, "interval": [over_default - 0.1, over_default + 0.1],
                      "best_default": "eagle2_60_5_10", "prompts": 8},
        }},
    }  # fmt: skip


def verdicts(gpu, results: dict) -> dict[str, str]:
    return {row.bar: row.verdict for row in gpu.check_summary.rows(results)}


def test_the_table_passes_bars_met_and_fails_bars_missed(gpu):
    met = verdicts(gpu, made_up_results(x_floor_1=1.25, graph_ms_1=9.8, greedy=650.0))
    missed = verdicts(gpu, made_up_results(x_floor_1=2.78, graph_ms_1=5.0, greedy=93.8))
    one_token = "latency: one token <= 1.3x its floor"
    assert (met[one_token], missed[one_token]) == ("pass", "FAIL")
    over = "latency <= 1.05x a graph-captured transformers forward"
    assert (met[over], missed[over]) == ("pass", "FAIL")  # 10 ms over 9.8, and over 5.0
    speed = "embedded model: plain greedy >= 600 tokens/s"
    assert (met[speed], missed[speed]) == ("pass", "FAIL")
    assert met["profile: recommended >= 2.0x greedy, interval above 1.5, lossless"] == "pass"
    suite = "drafter contract (and static step) suite passes on the GPU"
    assert met[suite] == "pass"
    on_cpu = made_up_results(x_floor_1=1.25, graph_ms_1=9.8, greedy=650.0)
    on_cpu["tests"]["data"]["device"] = "cpu"
    assert verdicts(gpu, on_cpu)[suite] == "not measured"  # passing on a CPU is not the bar


def over_default_row(gpu, results: dict):
    bar = "profile: tuned >= 1.15x its family's published default"
    return {row.bar: row for row in gpu.check_summary.rows(results)}[bar]


def test_the_tuned_setting_over_its_best_published_default_passes_at_1_15x(gpu):
    met = over_default_row(gpu, made_up_results(1.25, 9.8, 650.0, over_default=1.31))
    missed = over_default_row(gpu, made_up_results(1.25, 9.8, 650.0, over_default=1.02))
    assert (met.verdict, missed.verdict) == ("pass", "FAIL")
    assert met.measured == "eagle 1.31x [1.21, 1.41] over eagle2_60_5_10, 8 prompts, lossless True"
    assert missed.measured.startswith("eagle 1.02x [0.92, 1.12] over eagle2_60_5_10")
    # a family that publishes no default: the script's line, and no verdict
    results = made_up_results(1.25, 9.8, 650.0)
    line = "self_spec has no published default to measure against: Draft & Verify ..."
    results["against_defaults"]["data"].update(ratio=None, variants={}, no_default=line)
    assert over_default_row(gpu, results) == gpu.check_summary.Row(met.bar, line, "not measured")
    results["against_defaults"] = {"status": "timeout", "why": "stopped at its limit of 90 s"}
    row = over_default_row(gpu, results)
    assert row.verdict == "not run" and "against_defaults: timeout" in row.measured


def test_the_against_defaults_step_measures_the_profile_the_check_wrote(gpu, tmp_path):
    args = gpu.check.parse_args(["--state", str(tmp_path), "--device", "cuda"])
    model = tmp_path / "model.gguf"
    ctx = gpu.check_steps.Context(args, tmp_path, model, True, time_left=lambda: 500.0)
    step = {s.name: s for s in gpu.check_steps.STEPS}["against_defaults"]
    assert step.command(ctx) == "no profile to measure: the profile step wrote none"
    (tmp_path / "profile.yaml").write_text("schema: autotune/profile@1\n")
    command = step.command(ctx)
    assert command[1].endswith("benchmarks/against_defaults.py")
    assert command[2] == str(tmp_path / "profile.yaml")
    options = dict(zip(command[3::2], command[4::2]))
    assert options["--model-path"] == str(model) and options["--device"] == "cuda"
    assert options["--limit"] == "8" and options["--out"] == str(tmp_path / "against_defaults.json")
    assert float(options["--time-limit"]) < gpu.check_steps.GPU_LIMITS["against_defaults"]


def test_again_measures_the_steps_it_runs_anew_and_keeps_the_skipped_ones(gpu, tmp_path):
    saved = {"latency": {"status": "ok"}, "profile": {"status": "ok"}}
    args = gpu.check.parse_args(["--state", str(tmp_path)])
    assert gpu.check.earlier_results(saved, args) == saved
    args = gpu.check.parse_args(["--state", str(tmp_path), "--again", "--skip", "profile"])
    assert gpu.check.earlier_results(saved, args) == {"profile": {"status": "ok"}}


def test_the_profile_keeps_the_time_of_the_step_that_measures_it(gpu, tmp_path):
    def budget(time_left: float, *flags: str) -> float:
        args = gpu.check.parse_args(["--state", str(tmp_path), "--device", "cuda", *flags])
        ctx = gpu.check_steps.Context(args, tmp_path, None, True, time_left=lambda: time_left)
        return gpu.check_steps.profile_budget(ctx)

    slack, after = gpu.check_steps.PROFILE_SLACK_S, gpu.check_steps.GPU_LIMITS["against_defaults"]
    assert budget(1000.0) == gpu.check_steps.PROFILE_BUDGET_S
    assert budget(300.0) == 300.0 - slack - after
    assert budget(300.0, "--skip", "against_defaults") == 300.0 - slack
    assert budget(300.0, "--profile-budget", "100") == 100.0


def test_the_default_profile_budget_trains_heads_on_a_gpu(gpu):
    """The plan the profile makes (``plan.untrainable``), at a graph-captured SmolLM2-135M
    forward of 600 tokens/s, keeps a head kind to train within the check's default
    budget (less a set-up's half minute), where the old 150 s dropped them all; at
    ``--profile-budget 400`` every kind is trained, GLIDE's 5 minutes on 2 cores scaled
    to the GPU's batched forward."""
    from autotune import plan
    from autotune.training.kinds import KINDS

    train = {"medusa": "medusa", "eagle": "eagle", "glide": "glide"}
    relative = tuple(1.0 + 0.004 * n for n in range(128))  # near flat, as a graph's
    per_token = relative[-1] / 600 / 128  # the profile's rate: its 128-token forward's
    facts = plan.Facts(
        forward_s=1 / 600,
        verify_relative=relative[: plan.PROBE_CURVE_TOKENS],
        methods=("ngram", "self_spec", "medusa", "eagle", "glide"),
        draft_free=("ngram",),
        train=train,
        min_training={kind: KINDS[kind].least_training_s(per_token) for kind in train.values()},
        answer_prompts=60,
        extra_answer_prompts=200,
        params=135_000_000,
        cpu=False,
    )

    def trained(budget: float) -> set[str]:
        seconds = budget - 30.0 - plan.CLOSING_S
        return set(train.values()) - set(plan.untrainable(facts, plan.Evidence(), seconds))

    assert trained(150.0) == set()
    assert "eagle" in trained(gpu.check_steps.PROFILE_BUDGET_S)
    assert trained(400.0) == {"medusa", "eagle", "glide"}


def test_the_table_names_the_card_and_says_what_did_not_run(gpu):
    results = made_up_results(x_floor_1=1.25, graph_ms_1=9.8, greedy=650.0)
    results["profile"] = {"status": "skipped", "why": "no model yet"}
    del results["greedy"]
    table = gpu.check_summary.table(results)
    lines = table.splitlines()
    assert lines[0].startswith("GPU check on NVIDIA H100 80GB HBM3: torch 2.11.0, CUDA 13.0")
    assert "commit abc123" in lines[0]
    assert any("greedy did not run" in line and line.endswith("not run") for line in lines)
    assert any("profile: skipped: no model yet" in line for line in lines)
    assert (
        "engine step (graph_step.py), n=1: eager 17.70 ms (1.00x), cuda-graph 8.85 ms (0.50x)"
        in lines
    )
    assert lines[-1] == "4 of 11 bars met"  # two latency bars, the reference, the suite
    assert "management library" not in lines[0]  # it was not asked (an older check.json)
    results["environment"]["data"] |= {"gpus": 1, "nvml_gpus": None}
    heading = gpu.check_summary.table(results).splitlines()[0]
    assert heading.endswith(
        "(NVIDIA's management library counts no GPUs where torch sees 1: Ray is told torch's count)"
    )
    results = made_up_results(x_floor_1=1.25, graph_ms_1=9.8, greedy=650.0)
    lines = gpu.check_summary.table(results).splitlines()
    step = "embedded greedy, a decode step: 1510 us, its step replayed alone 1390 us, "
    assert step + "around it 120 us" in lines
    prefill = "embedded prefill of 180 tokens: in parts of the step 4.20 ms, one eager call "
    assert prefill + "11.50 ms (the engine took parts)" in lines


def test_profile_facts_and_pytest_counts_read_what_the_bars_need(gpu):
    document = {
        "hardware": {"device": "cuda:0"},
        "recommended": "eagle",
        "methods": {"eagle": {"measured": {"speedup": 2.1}, "study": "m/eagle"}},
        "diagnostics": {
            "methods": {"ngram": {"study": "m/ngram"}, "eagle": {"study": "m/eagle"}},
            "verdict": {"time": [
                {"phase": "train eagle heads", "spent_s": 30.5},
                {"phase": "train medusa heads", "spent_s": 0.0},
                {"phase": "tune eagle", "spent_s": 50.0},
            ]},
        },
    }  # fmt: skip
    facts = gpu.check_summary.profile_facts(document)
    assert facts["studies"] == ["eagle", "ngram"]
    assert (facts["heads_trained"], facts["training_s"]) == (["eagle"], 30.5)
    assert facts["measured"] == {"speedup": 2.1}
    counts = gpu.check_steps.pytest_counts(
        "....\n55 passed, 1 failed, 1 error, 2 skipped in 40.1s\n"
    )
    assert counts == {"passed": 55, "failed": 1, "errors": 1, "skipped": 2}


def test_the_tests_step_names_each_failing_test_even_when_stopped(gpu, tmp_path):
    """One line a test (pytest -v): a run stopped at its limit, with no closing counts,
    still says which tests failed."""
    args = gpu.check.parse_args(["--state", str(tmp_path), "--device", "cuda"])
    ctx = gpu.check_steps.Context(args, tmp_path, None, True, time_left=lambda: 500.0)
    step = {s.name: s for s in gpu.check_steps.STEPS}["tests"]
    assert "-v" in step.command(ctx)
    output = (
        "tests/test_static_step.py::test_greedy PASSED  [  1%]\n"
        "tests/test_static_step.py::test_equal[on the device] FAILED  [  2%]\n"
        "tests/test_static_glide.py::test_draft[as made] ERROR  [  3%]\n"
    )
    done = gpu.check_steps.subprocess.CompletedProcess([], -15, output, "")
    data = step.parse(ctx, done)
    assert data["failing"] == [
        "tests/test_static_step.py::test_equal[on the device]",
        "tests/test_static_glide.py::test_draft[as made]",
    ]


def test_on_a_gpu_the_graph_step_also_lists_the_steps_kernels_by_name(gpu, tmp_path):
    """The kernels a forward of 1 and of 64 tokens runs, by name (what grows with the
    verify size): asked on a GPU, and tallied per forward."""
    step = {s.name: s for s in gpu.check_steps.STEPS}["graph_step"]
    for device, quick, asked in (("cuda", [], True), ("cuda", ["--quick"], False)):
        args = gpu.check.parse_args(["--state", str(tmp_path), "--device", device, *quick])
        ctx = gpu.check_steps.Context(args, tmp_path, None, True, time_left=lambda: 500.0)
        assert ("--kernels" in step.command(ctx)) == asked
    graph_step = importlib.import_module("graph_step")
    kernels = [("gemv", 30.0), ("rms", 2.0), ("gemv", 30.0), ("rms", 2.0), ("sdpa", 5.0)] * 2
    table = graph_step.kernel_table(kernels, rounds=2, top=2)
    assert table == {
        "kernels": 5.0,
        "total_us": 69.0,
        "top": [
            {"name": "gemv", "count": 2.0, "us": 60.0},
            {"name": "sdpa", "count": 1.0, "us": 5.0},
        ],
    }
    assert graph_step.step_kernels(torch.nn.Linear(2, 2)) == {"skipped": "cuda only"}


def test_the_graph_step_writes_each_part_as_it_ends_and_starts_none_past_its_limit(
    gpu, tiny_llama, monkeypatch
):
    """A run stopped at the check's limit keeps the parts it measured (the compile of a
    13B step takes tens of seconds a size), and parts past ``--time-limit`` say so."""
    graph_step = importlib.import_module("graph_step")
    written: list[list[str]] = []

    def write(result: dict) -> None:
        written.append([*result.get("columns", {}), *(["kernels"] if "kernels" in result else [])])

    args = argparse.Namespace(repeats=1, kernels=True, time_limit=float("inf"))
    result = graph_step.measure(args, tiny_llama, {}, write)
    assert result["kernels"] == {"skipped": "cuda only"}
    assert written[0] == ["kernels"] and len(written) == 1 + len(graph_step.WAYS)
    assert set(result["columns"]["eager"]["ms"]) == set(graph_step.SIZES)
    assert result["columns"]["compile"] == {"skipped": "cuda only"}  # on a CPU
    assert graph_step.SIZES_OF["compile"] == (1, 64)
    from autotune.engine import layers

    # a column for each of the layers' fused forms turned off, and only while it is timed
    assert {off for _, off in graph_step.WAYS.values() if off} == set(layers.FUSION_RULES)
    seen: list[bool] = []
    rule = layers.fused_norm_applies

    def spied(x):
        seen.append(True)
        return rule(x)

    monkeypatch.setattr(layers, "fused_norm_applies", spied)
    monkeypatch.setitem(graph_step.WAYS, "eager, plain norm", ("eager", "fused_norm_applies"))
    monkeypatch.setitem(graph_step.SIZES_OF, "eager, plain norm", (1, 64))
    plain = graph_step.time_way(tiny_llama, "eager, plain norm", 1)
    assert set(plain["ms"]) == {1, 64} and not seen  # the rule off: never asked
    assert layers.fused_norm_applies is spied  # and back after: asked again
    graph_step.time_way(tiny_llama, "static-eager", 1)
    assert seen
    late = graph_step.measure(
        argparse.Namespace(repeats=1, kernels=False, time_limit=0.0), tiny_llama, {}, write
    )
    assert all(
        c["skipped"].startswith("not started: past --time-limit") for c in late["columns"].values()
    )
    assert "kernels" not in late
    lines = graph_step.table({**result["columns"], "compile": {"ms": {1: 2.0, 64: 3.0}}})
    assert lines[2].split()[-1] == "-"  # n=2: the compile column did not time it


def test_the_table_says_which_kernels_grew_from_one_token_to_64(gpu):
    def size(kernels: float, total: float, *top: tuple[str, float]) -> dict:
        return {
            "kernels": kernels,
            "total_us": total,
            "top": [{"name": n, "count": 1.0, "us": us} for n, us in top],
        }

    kernels = {
        "1": size(451.0, 9100.0, ("gemv", 6000.0), ("attention", 300.0), ("rms_norm", 200.0)),
        "64": size(451.0, 11900.0, ("gemm", 7000.0), ("attention", 2200.0), ("rms_norm", 210.0)),
    }
    lines = gpu.check_summary.kernel_lines(kernels, most=2)
    assert lines == [
        "engine step kernels, n=1: 451 a forward, 9100 us",
        "engine step kernels, n=64: 451 a forward, 11900 us",
        "grew most from n=1 to n=64: gemm 0 -> 7000 us; attention 300 -> 2200 us",
    ]
    results = made_up_results(x_floor_1=1.25, graph_ms_1=9.8, greedy=650.0)
    results["graph_step"]["data"]["kernels"] = kernels
    table = gpu.check_summary.table(results).splitlines()
    shown = gpu.check_summary.kernel_lines(kernels)
    assert all(line in table for line in shown)
    assert shown[-1].endswith("; rms_norm 200 -> 210 us")
    assert gpu.check_summary.kernel_lines({"skipped": "cuda only"}) == []


def test_the_embedded_step_is_replayed_with_each_gpu_form_off_in_turn(gpu, tiny_llama):
    """The greedy step's replay by form (``greedy_vs_hf.replays_by_form``), here on a
    CPU's fixed-shape step run eagerly: one figure a form, every rule back after, and
    the table's line."""
    from autotune.engine import layers
    from autotune.engine.runner import Runner

    greedy_vs_hf = importlib.import_module("greedy_vs_hf")
    rules = {rule: getattr(layers, rule) for rule in layers.FUSION_RULES}
    assert greedy_vs_hf.replays_by_form(Runner(tiny_llama, static=False), [1, 5, 9]) == {}
    found = greedy_vs_hf.replays_by_form(Runner(tiny_llama, static=True), [1, 5, 9], replays=3)
    assert set(found) == {
        "step_replay_us_plain_norm",
        "step_replay_us_plain_rotation",
        "step_replay_us_plain_residual",
        "step_replay_us_plain_products",
    }
    assert all(us > 0 for us in found.values())
    assert {rule: getattr(layers, rule) for rule in layers.FUSION_RULES} == rules
    results = made_up_results(x_floor_1=1.25, graph_ms_1=9.8, greedy=650.0)
    results["greedy"]["data"] |= {
        "step_replay_us_plain_norm": 1500.0,
        "step_replay_us_plain_rotation": 1400.0,
        "step_replay_us_plain_residual": 1420.0,
        "step_replay_us_plain_products": 1380.0,
    }
    lines = gpu.check_summary.table(results).splitlines()
    assert (
        "embedded step replayed with one fused form off: plain norm 1500 us, plain rotation "
        "1400 us, plain residual 1420 us, plain products 1380 us (every form on: 1390 us)"
    ) in lines
