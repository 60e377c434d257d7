"""`autotune studies`: what the study database holds — list, show, trials, plot, delete.

The database is read by ``studies.reading`` (read-only: no model, no Ray, no torch);
here: the profiles a study fed (for `show`, read from profile YAML files), its plots,
and the tables and lines the commands print.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.files import atomic_path
from autotune.studies.reading import StudyDatabase as StudyDatabase  # the commands' reader
from autotune.studies.reading import StudySummary, TrialRow

# --- the profile a study fed -------------------------------------------------------------


@dataclass
class ProfileUse:
    path: Path
    method: str  # key under methods:
    block: dict[str, Any]  # methods.<method> as written
    model: dict[str, Any]
    recommended: str | None


def profiles_naming(summary: StudySummary, folder: Path) -> Iterator[ProfileUse]:
    """Profiles in ``folder`` whose ``methods.<m>.study`` names this study.

    A self-spec profile records the prefix ``<model>/self_spec``: its mask study and its
    draft-exit studies (one per mask, user attr ``skip``) sit below it; a draft-exit study
    fed the profile only if its mask is the profile's.
    """
    import yaml

    paths = sorted([*folder.glob("*.yaml"), *folder.glob("*.yml")]) if folder.is_dir() else []
    for path in paths:
        try:
            data = yaml.safe_load(path.read_text())
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue  # not ours to judge here: `autotune validate` does
        methods = _method_blocks(data)
        if not methods:
            continue
        for method, block in methods.items():
            if isinstance(block, dict) and _fed(summary, block):
                model = data.get("model")
                yield ProfileUse(
                    path,
                    method,
                    block,
                    model if isinstance(model, dict) else {},
                    data.get("recommended"),
                )


def _fed(summary: StudySummary, block: dict) -> bool:
    recorded = block.get("study")
    names = list(recorded.values()) if isinstance(recorded, dict) else [recorded]
    name = summary.name
    if not any(isinstance(r, str) and (name == r or name.startswith(r + "/")) for r in names):
        return False
    skip = summary.user_attrs.get("skip")
    return skip is None or _same_skip(skip, block.get("skip"))


def _same_skip(a: Any, b: Any) -> bool:
    if not isinstance(a, dict) or not isinstance(b, dict):
        return False
    return all(sorted(a.get(k) or []) == sorted(b.get(k) or []) for k in ("attention", "mlp"))


# --- plots ------------------------------------------------------------------------------

MIN_TRIALS_FOR_IMPORTANCE = 2


@dataclass
class PlotResult:
    written: list[Path]
    skipped: list[str]  # why a plot was not drawn, one line each


def plot_study(study: optuna.Study, out: Path) -> PlotResult:
    """Optimisation history and parameter importance as PNG files in ``out``."""
    import warnings

    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed, none opened
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as ovm

    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if not complete:
        return PlotResult([], [f"no complete trial in {study.study_name}: nothing to plot"])
    if len(study.directions) > 1:
        return PlotResult([], [f"{study.study_name} is multi-objective: not plotted"])
    out.mkdir(parents=True, exist_ok=True)
    stem = study.study_name.replace("/", "__").replace(":", "_")
    plots = {"history": lambda: ovm.plot_optimization_history(study)}
    skipped = []
    reason = _importance_unavailable(complete)
    if reason:
        skipped.append(f"parameter importance not drawn: {reason}")
    else:
        plots["importance"] = lambda: ovm.plot_param_importances(study)
    written = []
    for kind, draw in plots.items():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the matplotlib plots are "experimental"
                axes = draw()
        except (ValueError, RuntimeError, ImportError) as exc:
            skipped.append(f"{kind} not drawn: {str(exc).splitlines()[0][:200]}")
            continue
        _label(axes, study.study_name)
        path = out / f"{stem}-{kind}.png"
        figure = axes.get_figure(root=True)
        assert figure is not None  # an Axes drawn by Optuna belongs to a figure
        with atomic_path(path) as temp:  # whole or not at all: the format from the suffix
            figure.savefig(temp, dpi=120, bbox_inches="tight")
        plt.close(figure)
        written.append(path)
    return PlotResult(written, skipped)


INCHES_PER_BAR = 0.22  # importance bars: a skip-mask study has 2 per layer


def _label(axes, study_name: str) -> None:
    """The study's name in the title (Optuna's titles sit left or centre), and room for
    every parameter's bar."""
    for loc in ("left", "center"):
        title = axes.get_title(loc=loc)
        if title:
            axes.set_title(f"{title}: {study_name}", loc=loc)
            break
    bars = len(axes.get_yticklabels()) if axes.get_ylabel() == "Hyperparameter" else 0
    figure = axes.figure
    width, height = figure.get_size_inches()
    figure.set_size_inches(width, max(height, INCHES_PER_BAR * bars + 1.5))


def _importance_unavailable(complete: list[FrozenTrial]) -> str | None:
    if len(complete) < MIN_TRIALS_FOR_IMPORTANCE:
        return (
            f"it needs at least {MIN_TRIALS_FOR_IMPORTANCE} complete trials "
            f"(there are {len(complete)})"
        )
    names = set().union(*(t.params for t in complete))
    varied = [n for n in names if len({repr(t.params.get(n)) for t in complete}) > 1]
    if not varied:
        return "no parameter took more than one value in the complete trials"
    return None


# --- rendering --------------------------------------------------------------------------


def studies_table(summaries: list[StudySummary]):
    from rich.table import Table

    table = Table()
    for header in (
        "study",
        "model",
        "method",
        "complete",
        "failed",
        "running",
        "best",
        "speedup",
        "last update",
    ):
        numeric = header in ("complete", "failed", "running", "best", "speedup")
        table.add_column(
            header,
            justify="right" if numeric else "left",
            overflow="fold",
            no_wrap=header in ("last update",),
        )
    for s in summaries:
        table.add_row(
            s.name,
            _text(s.user_attrs.get("model")),
            _text(s.user_attrs.get("method")),
            str(s.count("COMPLETE")),
            str(s.count("FAIL")),
            str(s.count("RUNNING")),
            _number(None if s.best is None else s.best.value),
            _number(s.speedup),
            _when(s.last_update),
        )
    return table


def trials_heading(summary: StudySummary, rows: list[TrialRow]) -> str:
    objective = _text(summary.user_attrs.get("objective"), "value")
    return (
        f"{summary.name}: {len(rows)} of {len(summary.trials)} trials, best first "
        f"({summary.direction} {objective})"
    )


def trials_table(rows: list[TrialRow]):
    """Parameters that are the same in every row are left out (``--json`` has them all)."""
    from rich.table import Table

    varied = varied_params(rows)
    table = Table()
    for header in ("#", "state", "value", "params", "fail reason", "seconds"):
        table.add_column(
            header,
            justify="right" if header in ("#", "value", "seconds") else "left",
            overflow="fold",
        )
    for row in rows:
        params = " ".join(f"{k}={_param(row.params[k])}" for k in varied if k in row.params)
        table.add_row(
            str(row.number),
            row.state,
            _number(row.value),
            params or "-",
            _text(row.fail_reason, ""),
            _number(row.duration_s, 1),
        )
    return table


SHOWN_CONSTANTS = 6  # more than this many parameters the same in every row: just a count


def constant_params_note(rows: list[TrialRow]) -> str | None:
    """The parameters ``trials_table`` leaves out: the same in every row."""
    varied = varied_params(rows)
    constant = sorted(set().union(*(r.params for r in rows)) - set(varied)) if rows else []
    if not constant:
        return None
    if len(constant) > SHOWN_CONSTANTS:
        return f"{len(constant)} parameters are the same in every row (--json has them all)"
    first = next(r for r in rows if constant[0] in r.params)
    return "the same in every row: " + " ".join(
        f"{k}={_param(first.params.get(k))}" for k in constant
    )


def varied_params(rows: list[TrialRow]) -> list[str]:
    names = sorted(set().union(*(r.params for r in rows))) if rows else []
    if len(rows) < 2:
        return names
    return [n for n in names if len({repr(r.params.get(n)) for r in rows}) > 1]


def show_lines(
    summary: StudySummary, uses: list[ProfileUse], profiles_dir: Path, where: str
) -> list[str]:
    attrs = summary.user_attrs
    lines = [
        f"study {summary.name} ({where})",
        f"  objective: {summary.direction} {_text(attrs.get('objective'), 'value')}",
        f"  trials: {summary.count('COMPLETE')} complete, {summary.count('FAIL')} failed, "
        f"{summary.count('RUNNING')} running"
        + "".join(
            f", {summary.count(s)} {s.lower()}" for s in ("WAITING", "PRUNED") if summary.count(s)
        )
        + f"; last update {_when(summary.last_update)}",
        "study attributes:",
    ]
    lines += [f"  {k}: {_param(v)}" for k, v in sorted(attrs.items())] or ["  (none)"]
    best = summary.best
    if best is None:
        lines.append("best trial: none (no trial completed)")
    else:
        lines.append(
            f"best trial #{best.number}: value {_number(best.value)}"
            f" in {_number(best.duration_s, 1)} s"
        )
        lines.append("  parameters:")
        lines += [f"    {k}: {_param(v)}" for k, v in sorted(best.params.items())]
        lines.append("  measured:")
        lines += [f"    {k}: {_param(v)}" for k, v in sorted(best.user_attrs.items())] or [
            "    (nothing recorded)"
        ]
    lines += trial_lines(summary)
    if not uses:
        lines.append(
            f"profile: none in {profiles_dir}/ names this study (--profiles DIR looks elsewhere)"
        )
    for use in uses:
        lines.append(
            f"profile: {use.path} (methods.{use.method}; recommended {_text(use.recommended)})"
        )
        fingerprint = use.model.get("fingerprint")
        if attrs.get("fingerprint") and fingerprint and fingerprint != attrs["fingerprint"]:
            lines.append(
                f"  note: the profile's model fingerprint {fingerprint} is not "
                f"the study's {attrs['fingerprint']} (last run)"
            )
        block = {k: v for k, v in use.block.items() if k != "search"}
        lines += ["  " + line for line in _yaml({use.method: block}).rstrip().splitlines()]
    return lines


SHOWN_TRIALS = 20  # `studies show` lists this many; `studies trials` lists them all


def trial_lines(summary: StudySummary) -> list[str]:
    """The study's trials, best first, one line each: number, state, value, the parameters
    that differ between them, and duration."""
    rows = summary.trials
    if not rows:
        return ["trials: none"]
    varied = varied_params(rows)
    lines = [f"trials, best first ({len(rows)}):"]
    for row in rows[:SHOWN_TRIALS]:
        params = " ".join(f"{k}={_param(row.params[k])}" for k in varied if k in row.params)
        seconds = "" if row.duration_s is None else f" in {_number(row.duration_s, 1)} s"
        reason = f" ({row.fail_reason})" if row.fail_reason else ""
        lines.append(
            f"  #{row.number} {row.state} {_number(row.value)}{seconds}{reason} {params}".rstrip()
        )
    if len(rows) > SHOWN_TRIALS:
        lines.append(
            f"  and {len(rows) - SHOWN_TRIALS} more: `autotune studies trials {summary.name}`"
        )
    note = constant_params_note(rows)
    if note and len(rows) > 1:
        lines.append(f"  {note}")
    return lines


def show_data(summary: StudySummary, uses: list[ProfileUse], where: str) -> dict[str, Any]:
    """What `studies show` prints, for programs (`-f json|yaml`)."""
    best = summary.best
    return {
        **summary.as_dict(),
        "storage": where,
        "user_attrs": summary.user_attrs,
        "best": None if best is None else best.as_dict(),
        "trials_best_first": [row.as_dict() for row in summary.trials],
        "profiles": [
            {
                "path": str(use.path),
                "method": use.method,
                "recommended": use.recommended,
                "fingerprint": use.model.get("fingerprint"),
                "settings": {k: v for k, v in use.block.items() if k != "search"},
            }
            for use in uses
        ],
    }


def _yaml(data: dict) -> str:
    """Block style, but a list of plain values on one line (a tree: one path a line)."""
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    def sequence(dumper, items):
        flat = all(not isinstance(x, (list, dict)) for x in items)
        return dumper.represent_sequence("tag:yaml.org,2002:seq", items, flow_style=flat)

    Dumper.add_representer(list, sequence)
    return yaml.dump(data, Dumper=Dumper, sort_keys=False, default_flow_style=False, width=100)


def _when(when: datetime | None) -> str:
    return "-" if when is None else when.strftime("%Y-%m-%d %H:%M")


def _number(value: Any, digits: int = 4) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "-"
    return f"{value:.{digits}f}"


def _text(value: Any, empty: str = "-") -> str:
    return empty if value is None or value == "" else str(value)


def _param(value: Any) -> str:
    if isinstance(value, float) and not value.is_integer():
        return f"{value:.6g}"
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return str(value)


def _method_blocks(data: object) -> dict:
    """A profile's method blocks as read from its YAML, each with what the profile keeps
    of it in its closing ``diagnostics`` section (the study's name lives there)."""
    if not isinstance(data, dict):
        return {}
    diagnostics = data.get("diagnostics")
    kept = diagnostics.get("methods") if isinstance(diagnostics, dict) else None
    kept = kept if isinstance(kept, dict) else {}
    methods = data.get("methods")
    methods = methods if isinstance(methods, dict) else {}
    out = {}
    for name in {**kept, **methods}:
        block, more = methods.get(name), kept.get(name)
        if isinstance(block, dict) or isinstance(more, dict):
            out[name] = {**(more if isinstance(more, dict) else {}), **(block or {})}
    return out
