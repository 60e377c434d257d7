"""The GPU check's steps: for each, the command that measures it (or why it cannot run
here), its time limit, and how its output becomes the step's data (``check.py`` runs
them, each in a process of its own)."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import check_summary

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
AUTOTUNE = [
    PYTHON,
    "-c",
    "import sys; sys.argv[0] = 'autotune'; from autotune.cli import app; app()",
]


@dataclass
class Context:
    """What the steps are run with: the arguments, where files go, the model."""

    args: argparse.Namespace
    state: Path  # where steps write their files (it outlives the call)
    model: Path | None
    ready: bool  # autotune's requirements are all installed
    time_left: Callable[[], float]  # seconds until the call's budget is spent

    @property
    def gpu(self) -> bool:
        return self.args.device.startswith("cuda")

    def file(self, name: str) -> Path:
        return self.state / name


@dataclass(frozen=True)
class Step:
    """One measurement: its command (or why it cannot run), how its output becomes the
    step's data, and what else its result records (``step_limit`` gives its time)."""

    name: str
    needs_model: bool
    command: Callable[[Context], list[str] | str]  # a reason (str) when it cannot run
    parse: Callable[[Context, subprocess.CompletedProcess], dict]
    extra: Callable[[Context], dict] = field(default=lambda ctx: {})


def json_file(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


# --- the steps ---------------------------------------------------------------------------


def environment_command(ctx: Context) -> list[str]:
    probe = (
        "import json, torch, transformers, platform; "
        "cuda = torch.cuda.is_available(); "
        "print(json.dumps({'device_name': torch.cuda.get_device_name(0) if cuda else "
        "platform.processor() or 'cpu', 'torch': torch.__version__, 'cuda': torch.version.cuda, "
        "'gpus': torch.cuda.device_count(), 'transformers': transformers.__version__, "
        "'python': platform.python_version(), 'nvml_gpus': nvml_gpus()}))"
    )
    return [PYTHON, "-c", NVML_PROBE + probe]


# The GPUs NVIDIA's management library counts (as Ray would count them, were it not told
# torch's count, ``studies.cluster.local_instance_options``); None where it cannot be loaded
NVML_PROBE = (
    "def nvml_gpus():\n"
    "    try:\n"
    "        import ray._private.thirdparty.pynvml as nvml\n"
    "        nvml.nvmlInit()\n"
    "        return nvml.nvmlDeviceGetCount()\n"
    "    except Exception:\n"
    "        return None\n"
)


def environment_parse(ctx: Context, done: subprocess.CompletedProcess) -> dict:
    data = json.loads(done.stdout.strip().splitlines()[-1])
    data["date"] = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    data["commit"] = ctx.args.commit or commit()
    return data


def commit() -> str | None:
    """HEAD, where the copy has its git folder; else the commit the bundle was made at."""
    done = subprocess.run(
        ["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True, text=True
    )
    if done.returncode == 0 and done.stdout.strip():
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "-uno"], cwd=ROOT, capture_output=True, text=True
        )
        return done.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")
    manifests = sorted(Path(ROOT / ".gpu-bundle").glob("carry*/manifest.json"))
    made = json_file(manifests[0]).get("commit") if manifests else None
    return f"{made[:12]} (the bundle's; no git here)" if made else None


def test_files() -> list[str]:
    """The contract suite, and the fixed-shape steps' tests (which run on the GPU when
    there is one, the steps recorded as CUDA graphs) where the tree has them."""
    files = [
        "tests/test_drafter_contract.py",
        "tests/test_static_step.py",
        "tests/test_static_lanes.py",
    ]
    files += ["tests/test_static_head.py", "tests/test_tree_step.py", "tests/test_static_glide.py"]
    files += ["tests/test_glide_chain.py"]
    return [name for name in files if (ROOT / name).is_file()]


def tests_command(ctx: Context) -> list[str]:
    # a line a test: a run stopped at its limit still says which failed
    command = [PYTHON, "-m", "pytest", "-v", "--tb=short", "-p", "no:cacheprovider"]
    command += ["-o", "addopts=", *test_files()]
    if ctx.args.quick:  # the plumbing only: one method's cases
        command += ["-k", "ngram and not cape"]
    return command


def tests_parse(ctx: Context, done: subprocess.CompletedProcess) -> dict:
    counts = pytest_counts(done.stdout)
    failing = re.findall(r"^(tests/\S+?::.+?) (?:FAILED|ERROR)(?: |$)", done.stdout, re.M)
    return {**counts, "device": ctx.args.device, "files": test_files(), "failing": failing}


def pytest_counts(output: str) -> dict[str, int]:
    """pytest's closing counts ("3 passed, 1 failed, 2 skipped in 4.1s")."""
    lines = [line for line in output.splitlines() if re.search(r"\d+ (passed|failed|error)", line)]
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    for number, word in re.findall(
        r"(\d+) (passed|failed|errors?|skipped)", lines[-1] if lines else ""
    ):
        counts["errors" if word.startswith("error") else word] = int(number)
    return counts


def full_size(ctx: Context) -> bool:
    return ctx.gpu and not ctx.args.quick


def model_shape(ctx: Context) -> list[str]:
    """The model the forward-timing steps share: Vicuna-13B's shapes in float16 on a GPU;
    else the embedded model's in float32 (13B does not fit a CPU's memory)."""
    if full_size(ctx):
        return ["--model", "vicuna-13b", "--random-weights", "--dtype", "float16"]
    return ["--model", "smollm2-135m", "--random-weights", "--dtype", "float32"]


def latency_command(ctx: Context) -> list[str]:
    sizes = ["--max-tokens", "64" if full_size(ctx) else "8"]
    options = ["--device", ctx.args.device, "--roofline", "-f", "json"]
    return [*AUTOTUNE, "latency", *model_shape(ctx), *sizes, *options]


def latency_parse(ctx: Context, done: subprocess.CompletedProcess) -> dict:
    return json.loads(done.stdout[done.stdout.index("{") :])


def hf_reference_command(ctx: Context) -> list[str]:
    sizes = "--sizes 1,8,16,32,64" if full_size(ctx) else "--sizes 1,8 --repeats 3"
    limit = max(10.0, step_limit(ctx, "hf_reference") - 50)  # room for one more compile
    options = ["--device", ctx.args.device, "--time-limit", f"{limit:.0f}"]
    options += ["--out", str(ctx.file("hf_reference.json"))]
    script = str(ROOT / "benchmarks/hf_graph_reference.py")
    return [PYTHON, script, *model_shape(ctx), *sizes.split(), *options]


def graph_step_command(ctx: Context) -> list[str] | str:
    """The engine's fixed-shape step eagerly, as CUDA graphs and compiled (its author's
    script, where the tree has it), on the latency step's shapes."""
    script = ROOT / "benchmarks/graph_step.py"
    if not script.is_file():
        return "benchmarks/graph_step.py is not in this tree"
    # room for the model's load before the parts, and for the last part begun in time
    limit = max(10.0, step_limit(ctx, "graph_step") - 45)
    options = ["--device", ctx.args.device, "--repeats", "3", "--time-limit", f"{limit:.0f}"]
    options += ["--out", str(ctx.file("graph_step.json"))]
    if full_size(ctx):  # the kernels by name: what grows from 1 token to 64
        options.append("--kernels")
    return [PYTHON, str(script), *model_shape(ctx), *options]


def greedy_command(ctx: Context) -> list[str] | str:
    sizes = "--prompts 2 --max-new-tokens 8" if ctx.args.quick else "--prompts 8"
    limit = max(10.0, step_limit(ctx, "greedy") - 30)
    options = ["--device", ctx.args.device, "--time-limit", f"{limit:.0f}"]
    options += ["--out", str(ctx.file("greedy.json"))]
    script = str(ROOT / "benchmarks/gpu/greedy_vs_hf.py")
    return [PYTHON, script, "--model-path", str(ctx.model), *sizes.split(), *options]


def profile_budget(ctx: Context) -> float:
    """The profile's --budget: what was asked, or less to end within this call with the
    time of the step that measures the profile kept (unless it is skipped)."""
    kept = 0.0 if "against_defaults" in ctx.args.skip else _limits(ctx)["against_defaults"]
    return min(ctx.args.profile_budget, ctx.time_left() - PROFILE_SLACK_S - kept)


def tiny_profile_model(ctx: Context) -> list[str]:
    """--quick's model: a tiny random LLaMA (scripts/tiny_model.py), a few trials of one
    method: the profile's plumbing in about a minute."""
    tiny = ctx.file("tiny")
    script = str(ROOT / "scripts/tiny_model.py")
    subprocess.run([PYTHON, script, str(tiny)], check=True, capture_output=True, env=step_env())
    space = f"self_spec={tiny}/self_spec.yaml"
    options = "--methods self_spec --time-budget 60 --heldback-prompts 2 --max-new-tokens 8"
    model = ["--model", f"{tiny}/tiny-llama", "--prompts", f"{tiny}/prompts.jsonl"]
    return [*model, "--search-space", space, *options.split()]


def profile_command(ctx: Context) -> list[str] | str:
    budget = profile_budget(ctx)
    if budget < 60:
        return f"{ctx.time_left():.0f} s left in this call: too little for a profile"
    if ctx.args.quick:
        try:
            model = tiny_profile_model(ctx)
        except subprocess.CalledProcessError as e:
            return f"scripts/tiny_model.py failed: {(e.stderr or b'').decode().strip()[-200:]}"
    else:
        model = ["--model", "smollm2-135m", "--model-path", str(ctx.model)]
    options = ["--device", ctx.args.device, "--budget", f"{budget:.0f}s"]
    if ctx.gpu:
        options += ["--gpus-per-trial", "1"]
    store = ["--out", str(ctx.file("profile.yaml"))]
    store += ["--storage", f"sqlite:///{ctx.file('studies.db')}"]
    return [*AUTOTUNE, "profile", *model, *options, *store]


def profile_parse(ctx: Context, done: subprocess.CompletedProcess) -> dict:
    lines = done.stdout.splitlines()
    table_end = max((i for i, line in enumerate(lines) if line.startswith("└")), default=-1)
    verdict = [line for line in lines[table_end + 1 :] if line.strip()]
    document = _yaml(ctx.file("profile.yaml"))
    return {"verdict_lines": verdict, "profile": check_summary.profile_facts(document)}


def against_defaults_command(ctx: Context) -> list[str] | str:
    """benchmarks/against_defaults.py on the profile the profile step wrote: its tuned
    setting against its family's published defaults on this device, on its held-back
    prompts (the first 8; with --quick 2 of 8 tokens), stopping in time to write."""
    profile = ctx.file("profile.yaml")
    if not profile.is_file():
        return "no profile to measure: the profile step wrote none"
    limit = max(10.0, step_limit(ctx, "against_defaults") - AGAINST_DEFAULTS_SLACK_S)
    sizes = "--limit 2 --max-new-tokens 8" if ctx.args.quick else "--limit 8"
    model = [] if ctx.args.quick else ["--model-path", str(ctx.model)]  # --quick: its own
    options = ["--device", ctx.args.device, "--time-limit", f"{limit:.0f}"]
    options += ["--out", str(ctx.file("against_defaults.json"))]
    script = str(ROOT / "benchmarks/against_defaults.py")
    return [PYTHON, script, str(profile), *model, *sizes.split(), *options]


def _yaml(path: Path) -> dict:
    try:
        import yaml

        return yaml.safe_load(path.read_text()) or {}
    except (ImportError, OSError, ValueError):
        return {}


PROFILE_SLACK_S = 75.0  # Ray's start, loading the model, writing the profile
# The profile's default --budget on a GPU. The run's own plan (``plan.untrainable``) at a
# graph-captured SmolLM2-135M forward (1.6 ms, 600 tokens/s) gives every head kind less
# than its least training at 150 s, and drops them all: no head would be trained, and
# the bars on heads could not pass. 240 s trains EAGLE heads, 400 s every kind
# (tests/test_gpu_check.py holds them together); with the other steps' limits the last
# call fits 540 s.
PROFILE_BUDGET_S = 240.0
AGAINST_DEFAULTS_SLACK_S = 40.0  # loading the model and heads, the last prompt, writing


def step_limit(ctx: Context, name: str) -> float:
    """Seconds a step may take: its own limit, or what is left of the call."""
    if name == "profile":
        return profile_budget(ctx) + PROFILE_SLACK_S
    return min(_limits(ctx)[name], ctx.time_left())


def _limits(ctx: Context) -> dict[str, float]:
    return QUICK_LIMITS if ctx.args.quick or not ctx.gpu else GPU_LIMITS


# Seconds each step may take on a GPU (about 11 minutes in all, over the calls that carry
# the bundle); on a CPU with --quick. The profile's is its budget plus PROFILE_SLACK_S.
GPU_LIMITS = {
    "environment": 60,
    # each test's runners record their own graphs: on an H200 (2026-11-28) 65 of the 127
    # tests had run after 150 s
    "tests": 300,
    "latency": 60,
    "hf_reference": 150,
    "graph_step": 90,
    "greedy": 120,
    "against_defaults": 90,
}
QUICK_LIMITS = {
    "environment": 60,
    "tests": 300,
    "latency": 180,
    "hf_reference": 180,
    "graph_step": 180,
    "greedy": 240,
    "against_defaults": 180,
}


def profile_extra(ctx: Context) -> dict:
    return {"budget_s": round(profile_budget(ctx)), "gpus_per_trial": 1 if ctx.gpu else 0}


def _data_file(name: str):
    def parse(ctx: Context, done: subprocess.CompletedProcess) -> dict:
        data = json_file(ctx.file(f"{name}.json"))
        if not data:
            raise ValueError(f"{name} wrote no JSON")
        return data

    return parse


STEPS = [
    Step("environment", False, environment_command, environment_parse),
    Step("tests", False, tests_command, tests_parse),
    Step("latency", False, latency_command, latency_parse),
    Step("hf_reference", False, hf_reference_command, _data_file("hf_reference")),
    Step("graph_step", False, graph_step_command, _data_file("graph_step")),
    Step("greedy", True, greedy_command, _data_file("greedy")),
    Step("profile", True, profile_command, profile_parse, extra=profile_extra),
    Step("against_defaults", True, against_defaults_command, _data_file("against_defaults")),
]


def step_env() -> dict[str, str]:
    """The steps' environment: autotune and the benchmarks importable from this tree,
    output unbuffered, Ray's usage report off (there is no network)."""
    given = filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))
    paths = [str(ROOT), str(ROOT / "benchmarks"), *given]
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(paths),
        "PYTHONUNBUFFERED": "1",
        "RAY_USAGE_STATS_ENABLED": "0",
        "TOKENIZERS_PARALLELISM": "false",
    }
