"""The command line's conventions (issue 42): `profile --help` fits a screen, one duration
syntax for every time option, `-f/--format` (and `--json`, its alias) on every command
that prints data, the accepted values of --engine, --kind, --device and --dtype shown in
--help, and `profile` ending with the commands that deploy its recommendation."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest
import typer
from typer.testing import CliRunner

import autotune.bench
import autotune.cli.options
import autotune.commands.heads
import autotune.commands.profile
import autotune.measure.device_latency
import autotune.verify
from autotune.cli import app
from autotune.cli.options import DTYPES, device_option, dtype_option
from autotune.cli.remeasure import VERIFIED_ENGINES
from autotune.commands.profile import NOTHING_TO_EXPORT, next_steps
from autotune.export.engines import ENGINES
from autotune.methods import registry
from autotune.profile.io import read_profile
from autotune.training.kinds import KINDS

DATA = Path(__file__).parent / "data"
PROFILE = DATA / "profile_smollm2-135m_self_spec.yaml"
DURATIONS = {"18m": 1080.0, "900s": 900.0, "1h": 3600.0, "45": 45.0}

pytestmark = pytest.mark.usefixtures("one_thread")  # bench and latency set torch's threads


def invoke(*args, columns: int = 200, **kwargs):
    env = {"COLUMNS": str(columns), "NO_COLOR": "1", **kwargs.pop("env", {})}
    return CliRunner().invoke(app, [str(a) for a in args], env=env, **kwargs)


def one_error_line(result) -> str:
    assert result.exit_code == 2, (result.stdout, result.stderr, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


# --- --help --------------------------------------------------------------------------


def test_profile_help_fits_a_screen_at_80_columns():
    result = invoke("profile", "--help", columns=80)
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) == 80  # laid out for 80 columns
    assert len(lines) <= 60, result.stdout
    assert "…" not in result.stdout, result.stdout
    # the everyday options come first, in click's own panel
    first_panel = result.stdout.split("╰")[0]
    for option in ("--model", "--prompts", "--out", "--budget", "--methods", "--engine"):
        assert option in first_panel, option
    assert "--device" in first_panel and "--ray-address" not in first_panel


def help_text(*args) -> str:
    """A command's --help as one line of words (the panels' borders and wrapping gone)."""
    result = invoke(*args, "--help")
    assert result.exit_code == 0
    return " ".join(result.stdout.replace("│", " ").split())


def test_choices_are_shown_in_help():
    """Each option with fixed values lists them in its help ("a, b or c"), from where
    they are defined: the exporters' engines, the head kinds, the devices and dtypes."""
    kinds = help_text("heads", "train")
    assert f"{', '.join(list(KINDS)[:-1])} or {list(KINDS)[-1]}" in kinds
    dtypes = "auto, float32, bfloat16 or float16"
    devices = "auto, cpu, cuda or cuda:N"
    engines = f"{', '.join(list(ENGINES)[:-1])} or {list(ENGINES)[-1]}"
    for args in (["heads", "train"], ["profile"], ["latency"], ["bench"]):
        text = help_text(*args)
        assert dtypes in text and devices in text, args
    for args in (["profile"], ["export"], ["bench"]):
        assert engines in help_text(*args), args
    assert " or ".join(VERIFIED_ENGINES) in help_text("verify")


def test_the_listed_choices_are_the_checked_ones():
    """The CLI lists copies of what torch-importing modules check (--help stays instant)."""
    from autotune import hardware

    assert ("auto", *hardware.DTYPES) == DTYPES
    assert VERIFIED_ENGINES == autotune.verify.ENGINES


def test_a_choice_not_listed_is_one_line_naming_the_choices(tmp_path):
    line = one_error_line(invoke("heads", "train", "--kind", "hydra", "--out", tmp_path / "h"))
    assert "hydra" in line and ", ".join(KINDS) in line
    line = one_error_line(invoke("export", PROFILE, "--engine", "tgi"))
    assert "unknown engine 'tgi'" in line and ", ".join(ENGINES) in line


# --- durations -----------------------------------------------------------------------


@pytest.fixture
def profile_request(monkeypatch, tmp_path):
    """The request `profile` builds from its options; nothing runs."""
    monkeypatch.chdir(tmp_path)
    seen = {}

    def checked(request):
        seen["request"] = request
        raise typer.Exit(0)

    monkeypatch.setattr(autotune.commands.profile, "profile_checked", checked)
    return seen


@pytest.fixture
def heads_job(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    seen = {}

    def checked(job, threads):
        seen["job"] = job
        raise typer.Exit(0)

    monkeypatch.setattr(autotune.commands.heads, "train_heads_checked", checked)
    return seen


@pytest.fixture
def verified(monkeypatch):
    """The arguments `verify` measures with; its report a fixed one."""
    seen = {}

    def verify(*args):
        seen["args"] = args
        return SimpleNamespace(summary=lambda: {"engine": args[1], "tune_s": args[7]})

    monkeypatch.setattr(autotune.verify, "verify", verify)
    monkeypatch.setattr(autotune.verify, "report_lines", lambda report: ["verified"])
    return seen


@pytest.mark.parametrize(("text", "seconds"), DURATIONS.items())
def test_one_duration_syntax(text, seconds, profile_request, heads_job, verified):
    result = invoke("profile", "--budget", text, "--time-budget", text)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    request = profile_request["request"]
    assert request.budget_s == seconds and request.time_budget_s == seconds
    result = invoke("heads", "train", "--kind", "medusa", "--time-budget", text)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    assert heads_job["job"].options.time_budget_s == seconds
    result = invoke("verify", PROFILE, "--engine", "llamacpp", "--tune", text, "--no-record")
    assert result.exit_code == 0, (result.stdout, result.stderr)
    assert verified["args"][7] == seconds


@pytest.mark.parametrize("garbage", ["soon", "5 minutes", "-5m", "0"])
def test_a_bad_duration_is_one_line_naming_the_option(
    garbage, profile_request, heads_job, verified
):
    cases = {
        "--budget": ["profile", "--budget", garbage],
        "--time-budget": ["profile", "--time-budget", garbage],
        "--tune": ["verify", PROFILE, "--engine", "llamacpp", "--tune", garbage],
    }
    for option, args in cases.items():
        line = one_error_line(invoke(*args))
        assert f"{option} {garbage!r}" in line, line
        assert "20m, 1h or 900s" in line or "positive duration" in line, line
    line = one_error_line(invoke("heads", "train", "--kind", "medusa", "--time-budget", garbage))
    assert f"--time-budget {garbage!r}" in line
    assert not profile_request and not heads_job and not verified


# --- -f/--format and --json ------------------------------------------------------------


@pytest.fixture
def db(tmp_path, monkeypatch) -> str:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("AUTOTUNE_STORAGE", raising=False)
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    study = optuna.create_study(study_name="tiny/ngram/abc", storage=url, direction="maximize")
    study.set_user_attr("objective", "speedup")
    study.enqueue_trial({"x": 1})
    study.optimize(lambda trial: trial.suggest_int("x", 1, 3) * 0.5, n_trials=1)
    return url


@pytest.fixture
def measured(monkeypatch):
    """bench, verify and latency with fixed results: what is tested is the printing."""
    monkeypatch.setattr(autotune.bench, "bench_profile", lambda *a: {"recommended": "x"})
    monkeypatch.setattr(
        autotune.verify, "verify", lambda *a: SimpleNamespace(summary=lambda: {"engine": a[1]})
    )
    monkeypatch.setattr(
        autotune.measure.device_latency,
        "measure_device_latency",
        lambda request: SimpleNamespace(as_dict=lambda: {"model": request.model}),
    )


def data_commands(db: str) -> dict[str, list]:
    return {
        "methods": ["methods"],
        "models list": ["models", "list"],
        "validate": ["validate", PROFILE],
        "bench": ["bench", PROFILE, "--threads", 1],
        "verify": ["verify", PROFILE, "--engine", "hf", "--no-record"],
        "latency": ["latency", "--threads", 1],
        "studies list": ["studies", "list", "--storage", db],
        "studies show": ["studies", "show", "tiny/ngram/abc", "--storage", db],
        "studies trials": ["studies", "trials", "tiny/ngram/abc", "--storage", db],
    }


def test_every_data_command_takes_f_json_and_its_json_alias(db, measured, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    for name, args in data_commands(db).items():
        as_f = invoke(*args, "-f", "json")
        assert as_f.exit_code == 0, (name, as_f.stdout, as_f.stderr)
        data = json.loads(as_f.stdout)
        alias = invoke(*args, "--json")
        assert alias.exit_code == 0, (name, alias.stderr)
        assert json.loads(alias.stdout) == data, name
        assert "--format" in invoke(*args, "--help").stdout, name


def test_methods_as_data_and_as_lines():
    rows = json.loads(invoke("methods", "-f", "json").stdout)
    by_name = {row["name"]: row for row in rows}
    assert set(by_name) == set(registry.entries())
    for name, method in registry.methods().items():
        assert by_name[name]["exports"] == list(method.exporters)
    lines = invoke("methods").stdout.splitlines()
    assert len(lines) == len(rows)
    assert any("exports: " in line for line in lines) and any("widens: " in line for line in lines)


# --- what to run after `profile` -----------------------------------------------------------


def test_profile_ends_with_the_export_commands_of_its_recommendation(tmp_path):
    profile = read_profile(PROFILE)
    path = tmp_path / "my profile.yaml"
    lines = next_steps(profile, path)
    engines = list(registry.method(profile.recommended).exporters)
    assert lines[0].startswith("next: ") and profile.recommended in lines[0]
    assert lines[1:] == [f"  autotune export '{path}' --engine {engine}" for engine in engines]
    # with --engine, only the engines deployed to
    assert next_steps(profile, path, (engines[-1],))[1:] == [
        f"  autotune export '{path}' --engine {engines[-1]}"
    ]


def test_profile_with_no_recommendation_says_what_to_do_instead(tmp_path):
    profile = read_profile(PROFILE).model_copy(update={"recommended": "none"})
    assert next_steps(profile, tmp_path / "p.yaml") == [NOTHING_TO_EXPORT]


def test_an_engine_deployed_to_that_refuses_says_why_in_the_next_line(tmp_path):
    # `profile --engine hf` of a Medusa profile: transformers has no Medusa heads
    profile = read_profile(DATA / "profile_smollm2-135m_medusa.yaml")
    assert "hf" not in registry.method("medusa").exporters
    lines = next_steps(profile, tmp_path / "p.yaml", ("hf",))
    assert len(lines) == 1 and lines[0].startswith("next: no hf export: ")
    assert "medusa" in lines[0]  # the export's own refusal, naming the method


def _options_named_by_metavar() -> list[str]:
    """Parameters of the commands' functions whose default is a call holding their name
    upper-cased (a metavar) but not their flag."""
    import ast

    unnamed = []
    for path in sorted(Path(autotune.cli.options.__file__).parent.glob("*.py")):
        for function in ast.walk(ast.parse(path.read_text())):
            if not isinstance(function, ast.FunctionDef):
                continue
            arguments = function.args.args + function.args.kwonlyargs
            defaults = [None] * (len(function.args.args) - len(function.args.defaults))
            defaults += [*function.args.defaults, *function.args.kw_defaults]
            for argument, default in zip(arguments, defaults, strict=True):
                if getattr(getattr(default, "func", None), "attr", None) == "Argument":
                    continue  # positional: no flag
                strings = [
                    node.value
                    for node in ast.walk(default or ast.Constant(None))
                    if isinstance(node, ast.Constant) and isinstance(node.value, str)
                ]
                flag = "--" + argument.arg.replace("_", "-")
                if argument.arg.upper() in strings and flag not in strings:
                    unnamed.append(f"{path.name}: {argument.arg}")
    return unnamed


def test_an_option_whose_metavar_is_its_name_names_its_flag_too():
    """typer 0.27 (the GPU machines' image has it) names an option whose metavar is its
    parameter's name upper-cased by that metavar: `--dtype` became `--DTYPE`, and the GPU
    check's `autotune latency --dtype float16` was "No such option". Such an option says
    its flag itself, whatever the typer version."""
    assert _options_named_by_metavar() == []
    assert "--device" in device_option().param_decls  # the helpers' metavars: DEVICE, DTYPE
    assert "--dtype" in dtype_option().param_decls
