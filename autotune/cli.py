"""Command line. Heavy libraries are imported inside commands so that --help is instant."""

from __future__ import annotations

import json
import signal
import sys
import threading
from contextlib import contextmanager
from functools import wraps
from pathlib import Path

import click
import typer

from autotune import plan
from autotune.errors import AutotuneError
from autotune.output import Format, format_option, render

app = typer.Typer(
    add_completion=True,  # --install-completion / --show-completion for bash, zsh, fish
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    help="Fit speculative-decoding settings to your model, hardware and workload.",
)
models_app = typer.Typer(no_args_is_help=True, help="Models autotune knows about.")
app.add_typer(models_app, name="models")


def _print_version(value: bool) -> None:
    if value:
        from autotune import __version__

        typer.echo(f"autotune {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    ctx: typer.Context,
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print the version."
    ),
) -> None:
    """Fit speculative-decoding settings to your model, hardware and workload."""
    import os

    # https://no-color.org: rich honours it by itself; click's coloured messages (secho)
    # take their colour setting from the context
    if os.environ.get("NO_COLOR"):
        ctx.color = False


def _user_errors(command):
    """No traceback reaches the user. An AutotuneError is theirs to fix: one line, exit
    status 2. Ctrl-C or SIGTERM: one line, status 130 (studies resume on the next run). Running out
    of memory: one line with what to try, status 2. Anything else is a bug of ours: one
    line naming the log file that holds the traceback, status 1."""

    @wraps(command)
    def run(*args, **kwargs):
        try:
            with _sigterm_as_interrupt():
                return command(*args, **kwargs)
        except (typer.Exit, typer.Abort, click.ClickException):
            raise  # the command's own exit, or click's usage error: already said
        except AutotuneError as exc:
            _fail(f"error: {exc}", 2)
        except KeyboardInterrupt:
            _fail(
                "interrupted: nothing was written; finished study trials are kept, and "
                "running the same command again resumes them",
                130,
            )
        except MemoryError as exc:
            _fail(
                f"error: out of memory ({exc or 'the machine'}): try a smaller model, "
                "--dtype bfloat16 or float16, fewer --workers, or a machine with more "
                "memory",
                2,
            )
        except Exception as exc:
            if type(exc).__name__ == "OutOfMemoryError":  # torch.cuda's
                _fail(
                    f"error: out of GPU memory ({str(exc).splitlines()[0][:160]}): try "
                    "--dtype float16, a smaller model or fewer --workers",
                    2,
                )
            log = _write_log(exc)
            _fail(
                f"error: autotune failed unexpectedly ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0][:200] if str(exc) else 'no message'}); this is a "
                f"bug: the details are in {log}, please report it",
                1,
            )

    return run


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


@contextmanager
def _sigterm_as_interrupt():
    """SIGTERM (``kill``, a scheduler ending a job) stops a command as Ctrl-C does: the
    same cleanup (``finally`` blocks, temporary files removed) and the same message."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set signal handlers
        return
    before = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield
    except SystemExit as exc:
        # ray.init() puts its own handler in place of ours, sys.exit(signum): the same stop
        if exc.code == signal.SIGTERM and signal.getsignal(signal.SIGTERM) is not _raise_interrupt:
            raise KeyboardInterrupt from None
        raise
    finally:
        signal.signal(signal.SIGTERM, before if before is not None else signal.SIG_DFL)


def _fail(line: str, status: int):
    typer.echo(line, err=True)
    raise typer.Exit(status)


def _write_log(exc: BaseException) -> str:
    """The traceback of an unexpected failure, in a file of its own."""
    import time
    import traceback

    from autotune.paths import cache_root

    text = "".join(traceback.format_exception(exc))
    try:
        folder = cache_root() / "logs"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"autotune-{time.strftime('%Y%m%d-%H%M%S')}-{id(exc):x}.log"
        path.write_text(f"autotune {' '.join(sys.argv[1:])}\n\n{text}")
        return str(path)
    except OSError:
        return "(no log: the cache folder is not writable)"


def _threads(threads: int | None) -> int:
    """Torch's thread count, set deliberately (recorded in the profile)."""
    from autotune.measure.noise import set_threads

    return set_threads(threads)


_MODEL_HELP = "Alias, Hugging Face repo id (from the local cache), model folder or .gguf file."
_DEVICE_HELP = "auto (a GPU when there is one, else the CPU), cpu, cuda or cuda:N."
_DTYPE_HELP = (
    "auto (bfloat16 or float16 on a GPU, float32 on the CPU), float32, bfloat16 or float16."
)


def _placement(dtype: str, device: str) -> tuple[str, str]:
    """--dtype and --device resolved at once, before any long work: a GPU asked for and
    absent is one line now, not after the prompts and heads are checked."""
    from autotune.models.loading import placement

    return placement(dtype, device)


def _pairs(values: list[str] | None, option: str) -> dict[str, str]:
    """``METHOD=VALUE`` options as {method: value}."""
    from autotune.methods import registry

    out = {}
    for value in values or []:
        name, sep, rest = value.partition("=")
        if not sep or not name.strip() or not rest.strip():
            raise AutotuneError(
                f"{option} {value!r}: write it as METHOD=VALUE, e.g. "
                f"{option} medusa=heads/smollm2-135m-medusa"
            )
        out[registry.get(name).name] = rest.strip()
    return out


@app.command()
@_user_errors
def profile(
    model: str = typer.Option("smollm2-135m", help=_MODEL_HELP),
    model_path: str | None = typer.Option(None, help="Where the weights of the alias are."),
    methods: str | None = typer.Option(
        None,
        help="Comma-separated methods to tune (default: every one that applies; "
        "`autotune methods` lists them).",
    ),
    prompts: str | None = typer.Option(None, help="JSONL calibration prompts (default: MT-bench)."),
    out: Path | None = typer.Option(None, help="Profile path (default profiles/<model>.yaml)."),
    storage: str | None = typer.Option(
        None,
        help="Study database SQLAlchemy URL "
        "(default $AUTOTUNE_STORAGE or sqlite:///studies/autotune.db).",
    ),
    trials: int | None = typer.Option(None, min=1, help="Trials of each method's main study."),
    budget: str = typer.Option(
        f"{plan.BUDGET_S / 60:.0f}m",
        help="Time for the whole run (18m, 1h, 900s): head training, searches, selection "
        "and the held-back measurement share it, as the printed plan shows.",
    ),
    time_budget: float | None = typer.Option(
        None,
        min=1,
        help="Seconds for each method's searches, in place of its share of --budget.",
    ),
    train_heads: bool = typer.Option(
        True,
        help="Train the heads a method needs when none are given or found (autotune's "
        "heads cache, then the Hugging Face cache); --no-train-heads skips those methods.",
    ),
    heads: list[str] | None = typer.Option(
        None,
        "--heads",
        metavar="METHOD=DIR",
        help="Head folder a method drafts with, e.g. medusa=DIR or eagle=DIR (repeatable).",
    ),
    search_space: list[str] | None = typer.Option(
        None,
        "--search-space",
        metavar="METHOD=FILE",
        help="Search-space YAML laid over a method's default (repeatable; `autotune "
        "search-space METHOD` prints the default).",
    ),
    heldback_prompts: int = typer.Option(
        16, min=1, help="Held-back prompts each method is measured on."
    ),
    max_new_tokens: int = typer.Option(128, min=2, help="Tokens per held-back prompt."),
    ray_address: str | None = typer.Option(
        None,
        help="Join the Ray cluster at HOST:PORT (default: $RAY_ADDRESS, else the cluster "
        "`ray start` left running here, else a local Ray instance sized to this machine).",
    ),
    workers: int = typer.Option(
        1,
        min=1,
        help="Trials at once; each worker loads the target once and keeps it between trials.",
    ),
    cpus_per_trial: float | None = typer.Option(
        None,
        min=0.1,
        help="Cores each trial reserves (default: a timed CPU trial takes a whole machine, a "
        "proxy trial an equal share).",
    ),
    gpus_per_trial: float = typer.Option(
        0.0,
        min=0.0,
        help="GPUs each trial reserves (timed trials then run side by side, one per GPU).",
    ),
    threads: int | None = typer.Option(
        None, min=1, help="Torch threads (default: the cores this process may use)."
    ),
    margin: float = typer.Option(
        0.0,
        min=0.0,
        help="Recommend a method only when its held-back interval's low end clears 1 + MARGIN.",
    ),
    select_prompts: int = typer.Option(
        plan.SELECT_PROMPTS,
        min=1,
        help="Most search prompts the methods' candidates race on, side by side, to rank them.",
    ),
    engine: list[str] | None = typer.Option(
        None,
        "--engine",
        metavar="ENGINE",
        help="The serving engine you deploy to (repeatable: vllm, sglang, trtllm, hf, "
        "llamacpp, dv): only methods it serves are tuned, each within what it can express "
        "(n-gram drafts by its own matching rule). Default: every method, and every "
        "engine's own n-gram setting beside the profile's.",
    ),
    concurrency: str = typer.Option(
        "1,2,4,8",
        metavar="LEVELS",
        help="After the verdict, the recommended method with this many requests in flight "
        "(comma-separated), level by level as the budget allows: each level's setting "
        "(shorter drafts, or off) and throughput speedup go in the profile's load block. "
        "none: skip.",
    ),
    device: str = typer.Option("auto", help=_DEVICE_HELP),
    dtype: str = typer.Option("auto", help=_DTYPE_HELP),
):
    """Tune the methods on this model and device; write a YAML decoding profile."""
    from rich.console import Console

    from autotune.export import check_engine
    from autotune.files import check_writable
    from autotune.measure.load import parse_levels
    from autotune.profile.report import plot_path, verdict_table
    from autotune.profiling import ProfileRequest, parse_methods, run_profile, verdict_lines
    from autotune.schedule import parse_duration
    from autotune.studies.cluster import ray_target
    from autotune.studies.workers import Workers, check_trial_gpus

    if out is not None:
        check_writable(out)  # before the model, the heads and the study database
    _threads(threads)
    dtype, device = _placement(dtype, device)
    check_trial_gpus(gpus_per_trial, device)
    ray_target(ray_address)  # a bad cluster address fails now, not after calibration
    request = ProfileRequest(
        model=model,
        model_path=model_path,
        methods=parse_methods(methods) if methods is not None else None,
        prompts=prompts,
        out=out,
        storage=storage,
        trials=trials,
        time_budget_s=time_budget,
        budget_s=parse_duration(budget),
        train_heads=train_heads,
        heads=_pairs(heads, "--heads"),
        search_spaces=_pairs(search_space, "--search-space"),
        heldback_prompts=heldback_prompts,
        max_new_tokens=max_new_tokens,
        select_prompts=select_prompts,
        margin=margin,
        workers=Workers(workers, cpus_per_trial, gpus_per_trial, ray_address),
        dtype=dtype,
        device=device,
        threads=threads,
        engines=tuple(dict.fromkeys(check_engine(e) for e in engine)) if engine else None,
        concurrency=parse_levels(concurrency),
    )
    result, path = run_profile(request)
    typer.echo(f"wrote {path}")
    plot = plot_path(path)
    if plot.exists():
        typer.echo(f"wrote {plot}")
    Console(width=120).print(verdict_table(result))
    for line in verdict_lines(result):
        typer.echo(line)


@app.command("methods")
@_user_errors
def methods_command():
    """The speculative methods autotune tunes, and the engines each exports to."""
    from autotune.methods import registry
    from autotune.methods.base import Method

    for name, entry in registry.entries().items():
        if isinstance(entry, Method):
            needs = f"; needs {entry.heads} heads" if entry.heads else ""
            engines = ", ".join(entry.exporters) or "-"
            typer.echo(f"{name:10} {entry.title}: {entry.summary}{needs}; exports: {engines}")
        else:
            chains = ", ".join(n for n, m in registry.methods().items() if m.chain)
            typer.echo(f"{name:10} {entry.title}: {entry.summary}; widens: {chains}")


@app.command("search-space")
@_user_errors
def search_space_command(method: str = typer.Argument(..., metavar="METHOD")):
    """Print a method's default search space (YAML): copy it, edit it, pass it back with
    `profile --search-space METHOD=FILE`."""
    from autotune.methods import registry
    from autotune.methods.base import packaged_space_text

    entry = registry.get(method)
    if entry.space_model is None:
        raise AutotuneError(f"{entry.name} has no search space")
    typer.echo(packaged_space_text(entry), nl=False)


@app.command()
@_user_errors
def bench(
    profile_path: Path = typer.Argument(..., metavar="PROFILE"),
    prompts: str | None = typer.Option(
        None, help="JSONL prompts (default: the profile's held-back split)."
    ),
    max_new_tokens: int = typer.Option(128, min=1),
    json_out: bool = typer.Option(
        False, "--json", help="The same as --format json: one object keyed by method."
    ),
    fmt: Format = format_option(),
    model_path: str | None = typer.Option(None, help="Override where the model is."),
    threads: int | None = typer.Option(None, min=1),
    device: str = typer.Option("auto", help=_DEVICE_HELP),
    dtype: str = typer.Option(
        "auto", help="auto (the profile's dtype), float32, bfloat16 or float16."
    ),
    concurrency: str | None = typer.Option(
        None,
        metavar="LEVELS",
        help="Measure the recommended method with this many requests in flight instead "
        "(comma-separated, e.g. 1,2,4,8): its scheduled and its tuned setting against "
        "plain decoding, throughput with intervals over rounds of prompts.",
    ),
    rounds: int = typer.Option(6, min=2, help="With --concurrency: rounds of prompts a level."),
    engine: str | None = typer.Option(
        None,
        help="With --concurrency: measure the setting this engine's export serves (its own "
        "drafting rule), capped per level as the export caps it.",
    ),
):
    """Re-measure a profile's methods against plain greedy decoding, independently."""
    from autotune.bench import bench_load, bench_profile
    from autotune.measure.load import parse_levels

    _threads(threads)
    fmt = Format.json if json_out else fmt
    if engine is not None and concurrency is None:
        raise AutotuneError("--engine goes with --concurrency: give the levels, e.g. 1,2,4,8")
    if concurrency is not None:
        levels = parse_levels(concurrency)
        if not levels:
            raise AutotuneError("--concurrency none: give the levels to measure, e.g. 1,2,4,8")
        load = bench_load(
            profile_path, levels, prompts, max_new_tokens, rounds, model_path, dtype, device, engine
        )
        if fmt is not Format.table:
            typer.echo(render(load, fmt))
            return
        for line in bench_load_lines(load):
            typer.echo(line)
        return
    results = bench_profile(profile_path, prompts, max_new_tokens, model_path, dtype, device)
    if fmt is not Format.table:
        typer.echo(render(results, fmt))
        return
    from autotune.measure.timing import interval_text

    for method, row in results.items():
        if not isinstance(row, dict):
            continue
        typer.echo(
            f"{method}: {interval_text(row)} ({row['tokens_per_s']:.1f} vs "
            f"{row['baseline_tokens_per_s']:.1f} tokens/s), {row['tokens_per_step']:.2f} "
            f"tokens/step, lossless {row['lossless']}, {row['prompts']} prompts"
        )
        for category, part in (row.get("by_category") or {}).items():
            typer.echo(f"  {category}: {interval_text(part)} ({part['prompts']} prompts)")
    holds = "holds" if results["recommended_holds"] else "does not hold here"
    typer.echo(f"the profile recommends {results['recommended']}: {holds}")


def bench_load_lines(load: dict) -> list[str]:
    """A line per level: the scheduled and the tuned setting against plain decoding."""
    from autotune.measure.load import requests_text
    from autotune.measure.timing import interval_text

    lines = []
    for row in load["levels"]:
        parts = []
        for name in dict.fromkeys([row["scheduled"], "tuned"]):
            figure = row.get(name)
            if figure is None:
                parts.append(f"{name} (plain decoding)")
                continue
            parts.append(
                f"{name} {interval_text(figure)} ({figure['tokens_per_s']:.1f} vs "
                f"{figure['baseline_tokens_per_s']:.1f} tokens/s, lossless {figure['lossless']})"
            )
        whose = f" (the {load['engine']} export's setting)" if load.get("engine") else ""
        lines.append(
            f"{load['method']}{whose} with {requests_text(row['concurrency'])} in flight, "
            f"{row['rounds']} rounds: " + "; ".join(parts)
        )
    return lines


@app.command()
@_user_errors
def validate(
    profile_path: Path = typer.Argument(..., metavar="PROFILE"),
    fmt: Format = format_option(),
):
    """Check a profile's shape against the schema, and its meaning against its own model
    block (layer indices within the model, trees within the heads, the recommended method
    present, positive sizes); name each wrong field and what it should be."""
    from autotune.profile.io import ProfileInvalidError, read_profile
    from autotune.profile.meaning import profile_problems

    try:
        problems = profile_problems(read_profile(profile_path))
    except ProfileInvalidError as exc:
        problems = exc.problems  # shape first: meaning is read from a well-formed profile
    if fmt is not Format.table:
        data = {"profile": str(profile_path), "valid": not problems, "problems": problems}
        typer.echo(render(data, fmt))
    else:
        for problem in problems:  # one line per wrong field
            typer.echo(f"error: {profile_path}: {problem}", err=True)
    if problems:
        raise typer.Exit(2)
    if fmt is Format.table:
        typer.echo(f"{profile_path}: valid")


@app.command()
@_user_errors
def export(
    profile_path: Path = typer.Argument(..., metavar="PROFILE"),
    engine: str = typer.Option(..., help="vllm, sglang, trtllm, hf, llamacpp or dv."),
    method: str | None = typer.Option(
        None, help="The method to export (default: the profile's recommended method)."
    ),
    out: Path | None = typer.Option(None, help="Write to this file instead of stdout."),
    force: bool = typer.Option(
        False,
        "--force",
        help="Export a method the profile does not recommend, or one that "
        "was not clearly faster than plain greedy decoding.",
    ),
):
    """Write a profile's recommended settings in a serving engine's own format. What the
    engine cannot express is printed as a warning and kept as a comment in the output."""
    from autotune.export import export_profile
    from autotune.export.base import about_path
    from autotune.files import check_writable, write_atomic
    from autotune.profile.io import read_profile

    result = export_profile(read_profile(profile_path), engine, method, force)
    if out is not None:
        check_writable(out)
    for warning in result.warnings:
        typer.secho(f"warning: {warning}", fg="yellow", err=True)
    if out is None:
        typer.echo(result.text, nl=False)
        if result.companion is not None:
            typer.secho(
                f"warning: these flags point to {result.companion.name}, a second file "
                f"(its content is in the comments above): pass --out to write both",
                fg="yellow",
                err=True,
            )
        return
    # the engine reads every key of a JSON file: where it came from is said beside it;
    # a companion file is what the export points to; all are written or none
    files = [(out, result.text_for(out))]
    about = about_path(out) if result.about is not None else None
    if about is not None and result.about is not None:
        files.append((about, result.about))
    companion = result.companion_path(out)
    if companion is not None and result.companion is not None:
        files.append((companion, result.companion.text))
    written: list[Path] = []
    try:
        for path, text in files:
            write_atomic(path, text)
            written.append(path)
    except BaseException:
        for path in written:
            path.unlink(missing_ok=True)
        raise
    also = "".join(f" and {path}" for path, _ in files[1:])
    typer.echo(
        f"wrote {out}{also} ({result.engine}, {result.method}; targets {result.engine_version})"
    )


@app.command("verify")
@_user_errors
def verify_command(
    profile_path: Path = typer.Argument(..., metavar="PROFILE"),
    engine: str = typer.Option(..., help="llamacpp or hf: the engine to measure the export in."),
    limit: int | None = typer.Option(
        None, min=1, help="At most this many held-back prompts (default: all of them)."
    ),
    max_new_tokens: int | None = typer.Option(
        None, min=1, help="Tokens a prompt decodes (default: the profile's)."
    ),
    gguf: Path | None = typer.Option(
        None, help="llama.cpp: the model as a GGUF file (default: the profile's, if a GGUF)."
    ),
    draft_gguf: Path | None = typer.Option(
        None, help="llama.cpp: the draft model an export that drafts with one needs."
    ),
    record: bool = typer.Option(
        True, "--record/--no-record", help="Write the figures into the profile (verified)."
    ),
    tune: str | None = typer.Option(
        None,
        metavar="DURATION",
        help="llama.cpp, n-gram: first tune ngram-simple's options in llama-server itself on "
        "the search prompts for at most this long (5m, 300s), and verify that setting; it "
        "becomes the profile's llama.cpp setting.",
    ),
    storage: str | None = typer.Option(
        None, help="Study database for --tune (default: as `autotune profile`)."
    ),
    json_out: bool = typer.Option(False, "--json", help="One JSON object instead of lines."),
    concurrency: str | None = typer.Option(
        None,
        metavar="LEVELS",
        help="llama.cpp: instead, serve with as many slots as the highest level and measure "
        "the export against plain decoding with this many concurrent requests "
        "(comma-separated, e.g. 1,2,4,8); recorded under the profile's load block.",
    ),
    rounds: int = typer.Option(6, min=2, help="With --concurrency: rounds of prompts a level."),
):
    """Measure the profile's export in the serving engine it is for: the engine's greedy
    decoding, its own default speculative setting and autotune's export, side by side on
    the held-back prompts, every output checked against the engine's greedy output."""
    import json

    from autotune.schedule import parse_duration
    from autotune.verify import load_report_lines, report_lines, verify, verify_load

    if concurrency is not None:
        from autotune.measure.load import parse_levels

        levels = parse_levels(concurrency)
        if engine.strip().lower() != "llamacpp" or not levels or tune is not None:
            raise AutotuneError(
                "--concurrency serves the export in llama-server with several slots: give "
                "--engine llamacpp, levels such as 1,2,4,8, and no --tune"
            )
        load = verify_load(
            profile_path, levels, rounds, limit, max_new_tokens, gguf, record, draft_gguf
        )
        if json_out:
            typer.echo(json.dumps(load.model_dump(), indent=1))
            return
        from autotune.profile.io import read_profile

        for line in load_report_lines(read_profile(profile_path).recommended, load):
            typer.echo(line)
        if record:
            typer.echo(f"recorded in {profile_path} (load.engines.llamacpp)")
        return

    report = verify(
        profile_path,
        engine.strip().lower(),
        limit,
        max_new_tokens,
        gguf,
        record,
        draft_gguf,
        parse_duration(tune) if tune is not None else None,
        storage,
    )
    if json_out:
        typer.echo(json.dumps(report.summary(), indent=1))
        return
    for line in report_lines(report):
        typer.echo(line)
    if record:
        typer.echo(f"recorded in {profile_path} (verified)")


engines_app = typer.Typer(no_args_is_help=True, help="Serving engines autotune runs itself.")
app.add_typer(engines_app, name="engines")


@engines_app.command("build")
@_user_errors
def engines_build(
    engine: str = typer.Argument(..., metavar="ENGINE", help="llamacpp"),
    jobs: int | None = typer.Option(None, min=1, help="Compile jobs (default: every core)."),
):
    """Build a serving engine from its pinned source package into autotune's cache
    (llamacpp: llama.cpp's llama-server, about 5 minutes on 2 cores)."""
    from autotune.errors import AutotuneError
    from autotune.serving import llamacpp

    if engine.strip().lower() != "llamacpp":
        raise AutotuneError(f"unknown engine '{engine}': autotune builds llamacpp only")
    already = llamacpp.built()
    path = llamacpp.build(jobs, log=lambda line: typer.echo(line, err=True))
    typer.echo(f"{'already built' if already else 'built'}: {path} ({llamacpp.release()})")


@models_app.command("list")
@_user_errors
def models_list(fmt: Format = format_option()):
    """Aliases and whether their weights are on this machine."""
    from autotune.models import list_models

    rows = list_models()
    if fmt is not Format.table:
        data = [
            {
                "alias": alias,
                "source": source,
                "found": status.startswith("found"),
                "path": status.removeprefix("found at ") if status.startswith("found") else None,
                "status": status,
            }
            for alias, source, status in rows
        ]
        typer.echo(render(data, fmt))
        return
    for alias, source, status in rows:
        typer.echo(f"{alias:14} {source:40} {status}")


heads_app = typer.Typer(no_args_is_help=True, help="Train drafting heads for a target model.")
app.add_typer(heads_app, name="heads")


@heads_app.command("train")
@_user_errors
def heads_train(
    kind: str = typer.Option(
        ...,
        help="Head kind: medusa (Medusa-1 heads) or eagle "
        "(an EAGLE-1/2 draft head: one decoder layer).",
    ),
    model: str = typer.Option("smollm2-135m", help=_MODEL_HELP),
    model_path: str | None = typer.Option(None, help="Where the weights of the alias are."),
    out: Path | None = typer.Option(
        None,
        help="Heads folder (default: autotune's heads cache, where `profile` finds them).",
    ),
    num_heads: int | None = typer.Option(
        None, min=1, help="Medusa only: heads; head k predicts k+2 tokens ahead (default 5)."
    ),
    prompts: str | None = typer.Option(None, help="JSONL calibration prompts (default: MT-bench)."),
    max_new_tokens: int | None = typer.Option(
        None, min=2, help="Length of the target's answers to train on (default 256)."
    ),
    epochs: int | None = typer.Option(
        None, min=1, help="Passes over the answers (default: medusa 6, eagle 40)."
    ),
    time_budget: float | None = typer.Option(
        None,
        min=1,
        help="Seconds for generation and training together (default: medusa 780, "
        "eagle 870): training ends early to keep it; the held-back report "
        "comes after.",
    ),
    threads: int | None = typer.Option(None, min=1, help="Torch threads (default: all cores)."),
    device: str = typer.Option("auto", help=_DEVICE_HELP),
    dtype: str = typer.Option("auto", help=_DTYPE_HELP),
):
    """Train heads on the target's own greedy answers; report accuracy on held-back prompts
    (per head for Medusa; per draft depth for EAGLE, each depth drafting from the last)."""
    import dataclasses

    from rich.console import Console

    from autotune.training.job import HeadsJob, default_options, run_heads_train
    from autotune.training.report import accuracy_table

    if kind == "eagle" and num_heads is not None:
        raise AutotuneError(
            "--num-heads is for Medusa heads only: an EAGLE head is one "
            "decoder layer that drafts depth by depth; leave --num-heads out"
        )
    _threads(threads)
    dtype, device = _placement(dtype, device)
    given = {
        "num_heads": num_heads,
        "max_new_tokens": max_new_tokens,
        "epochs": epochs,
        "time_budget_s": time_budget,
    }
    options = dataclasses.replace(
        default_options(kind), **{k: v for k, v in given.items() if v is not None}
    )
    job = HeadsJob(
        kind=kind,
        model=model,
        model_path=model_path,
        prompts=prompts,
        out=out,
        options=options,
        dtype=dtype,
        device=device,
    )
    result, folder = run_heads_train(job)
    stats = result.stats
    Console().print(
        accuracy_table(
            result.accuracy, f"held-back accuracy ({result.held_back_tokens} answer tokens)"
        )
    )
    typer.echo(
        f"trained {stats.epochs:.2f} epochs ({stats.steps} steps"
        f"{', stopped by --time-budget' if stats.stopped_by_time else ''}) on "
        f"{result.train_tokens} answer tokens in {result.seconds['total']:.0f} s"
    )
    typer.echo(f"wrote {folder}")


@app.command()
@_user_errors
def latency(
    model: str = typer.Option("smollm2-135m", help=_MODEL_HELP),
    model_path: str | None = typer.Option(None, help="Where the weights of the alias are."),
    random_weights: bool = typer.Option(
        False,
        "--random-weights",
        help="Build the model from its architecture alone (an alias's "
        "known shapes, or a folder's config.json) with random weights and no tokenizer: time a "
        "device before the weights are on it.",
    ),
    max_tokens: int | None = typer.Option(
        None, min=1, help="Verify sizes n = 1..N new tokens (default 16; 64 with --roofline)."
    ),
    roofline: bool = typer.Option(
        False,
        "--roofline",
        help="Also measure this machine's memory bandwidth and GEMM peak in the dtype, and "
        "print each size's floor, max(weight bytes / bandwidth, flops / peak), and the "
        "curve's ratio to it (sizes past 16 timed on a grid, the rest interpolated).",
    ),
    dtype: str = typer.Option("auto", help=_DTYPE_HELP),
    device: str = typer.Option("auto", help=_DEVICE_HELP),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
    threads: int | None = typer.Option(None, min=1, help="Torch threads (default: all cores)."),
):
    """This device's verify-latency curve: the time of one target forward over n new tokens
    after a context, and its cost relative to one token."""
    from autotune.measure.device_latency import (
        DEFAULT_MAX_TOKENS,
        ROOFLINE_MAX_TOKENS,
        LatencyRequest,
        latency_heading,
        latency_table,
        measure_device_latency,
        roofline_line,
    )

    _threads(threads)
    result = measure_device_latency(
        LatencyRequest(
            model=model,
            model_path=model_path,
            random_weights=random_weights,
            max_tokens=max_tokens or (ROOFLINE_MAX_TOKENS if roofline else DEFAULT_MAX_TOKENS),
            dtype=dtype,
            device=device,
            roofline=roofline,
        )
    )
    if json_out:
        typer.echo(json.dumps(result.as_dict(), indent=2))
        return
    typer.echo(latency_heading(result))
    if (line := roofline_line(result)) is not None:
        typer.echo(line)
    _console().print(latency_table(result))


studies_app = typer.Typer(
    no_args_is_help=True,
    help="The study database: list, show, trials, plot, delete, dashboard.",
)
app.add_typer(studies_app, name="studies")
_STORAGE_HELP = (
    "Study database SQLAlchemy URL (default $AUTOTUNE_STORAGE or sqlite:///studies/autotune.db)."
)


def _console():
    """Rich output, wide when not on a terminal, so that piped study names are never cut."""
    from rich.console import Console

    console = Console()
    return console if console.is_terminal else Console(width=200)


@studies_app.command("list")
@_user_errors
def studies_list(
    storage: str | None = typer.Option(None, help=_STORAGE_HELP),
    fmt: Format = format_option(),
):
    """Every study: model, method, trials, best value and measured speedup, last update."""
    from autotune.studies.inspect import StudyDatabase, studies_table

    db = StudyDatabase(storage)
    summaries = db.summaries()
    if fmt is not Format.table:
        data = {"storage": db.where, "studies": [s.as_dict() for s in summaries]}
        typer.echo(render(data, fmt))
        return
    if not summaries:
        typer.echo(f"no studies in {db.where}")
        return
    typer.echo(f"studies in {db.where}")
    _console().print(studies_table(summaries))


@studies_app.command("show")
@_user_errors
def studies_show(
    name: str = typer.Argument(..., metavar="NAME"),
    storage: str | None = typer.Option(None, help=_STORAGE_HELP),
    profiles: Path = typer.Option(
        Path("profiles"), help="Folder of profiles to search for the one this study fed."
    ),
    fmt: Format = format_option(),
):
    """A study's best parameters and measured figures, its attributes, and the profile it fed."""
    from autotune.studies.inspect import StudyDatabase, profiles_naming, show_data, show_lines

    db = StudyDatabase(storage)
    summary = db.summary(name)
    uses = list(profiles_naming(summary, profiles))
    if fmt is not Format.table:
        typer.echo(render(show_data(summary, uses, db.where), fmt))
        return
    for line in show_lines(summary, uses, profiles, db.where):
        typer.echo(line)


@studies_app.command("trials")
@_user_errors
def studies_trials(
    name: str = typer.Argument(..., metavar="NAME"),
    storage: str | None = typer.Option(None, help=_STORAGE_HELP),
    top: int | None = typer.Option(None, min=1, help="Only the N best trials."),
    json_out: bool = typer.Option(
        False, "--json", help="The same as --format json: every parameter and measured figure."
    ),
    fmt: Format = format_option(),
):
    """A study's trials, best first: number, state, value, parameters, fail reason, duration."""
    from autotune.studies.inspect import (
        StudyDatabase,
        constant_params_note,
        trials_heading,
        trials_table,
    )

    summary = StudyDatabase(storage).summary(name)
    rows = summary.trials[:top] if top else summary.trials
    fmt = Format.json if json_out else fmt
    if fmt is not Format.table:
        data = {
            "study": summary.name,
            "direction": summary.direction,
            "objective": summary.user_attrs.get("objective"),
            "trials": [row.as_dict() for row in rows],
        }
        typer.echo(render(data, fmt))
        return
    typer.echo(trials_heading(summary, rows))
    _console().print(trials_table(rows))
    note = constant_params_note(rows)
    if note:
        typer.echo(note)


@studies_app.command("plot")
@_user_errors
def studies_plot(
    name: str = typer.Argument(..., metavar="NAME"),
    storage: str | None = typer.Option(None, help=_STORAGE_HELP),
    out: Path = typer.Option(Path("studies/plots"), help="Folder for the PNG files."),
):
    """Optimisation history and parameter importance of a study, as PNG files."""
    from autotune.studies.inspect import StudyDatabase, plot_study

    result = plot_study(StudyDatabase(storage).load(name), out)
    for reason in result.skipped:
        typer.secho(f"note: {reason}", fg="yellow", err=True)
    for path in result.written:
        typer.echo(f"wrote {path}")


@studies_app.command("delete")
@_user_errors
def studies_delete(
    name: str = typer.Argument(..., metavar="NAME"),
    storage: str | None = typer.Option(None, help=_STORAGE_HELP),
    yes: bool = typer.Option(False, "--yes", "-y", help="Delete without asking."),
):
    """Delete one study and its trials (nothing else: measurements and profiles stay)."""
    from autotune.studies.inspect import StudyDatabase

    db = StudyDatabase(storage)
    trials = len(db.summary(name).trials)
    if not yes and not typer.confirm(
        f"delete study {name} and its {trials} trials from {db.where}?", default=False
    ):
        typer.echo("not deleted", err=True)
        raise typer.Exit(1)
    db.delete(name)
    typer.echo(f"deleted study {name} ({trials} trials)")


@studies_app.command("dashboard")
@_user_errors
def studies_dashboard(
    storage: str | None = typer.Option(None, help=_STORAGE_HELP),
    host: str = typer.Option(
        "127.0.0.1", help="Address to listen on (0.0.0.0: reachable from other machines)."
    ),
    port: int = typer.Option(8080, min=0, max=65535, help="Port (0: any free one)."),
):
    """Browse the study database in optuna-dashboard (an optional extra: pip install
    'autotune[dashboard]'); it follows running studies live. Ctrl-C stops it."""
    from autotune.studies.dashboard import dashboard_server, require_dashboard
    from autotune.studies.inspect import StudyDatabase

    require_dashboard()  # a missing extra is said before anything else
    db = StudyDatabase(storage)
    server = dashboard_server(db.storage, host, port)
    shown = f"[{host}]" if ":" in host else host
    typer.echo(f"optuna-dashboard of {db.where} at http://{shown}:{server.server_port}/")
    typer.echo("Ctrl-C stops it", err=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass  # the way to stop it: not an interruption of work
    finally:
        server.server_close()


def main() -> None:  # pragma: no cover
    sys.exit(app())
