"""`autotune studies`: what the study database holds — list, show, trials, plot, delete.

Reads the database only (and, for `show`, profile YAML files): no model, no Ray, no torch,
so it works as well on a database written by another machine, copied here or served by
PostgreSQL. Reading writes nothing: no table is created or migrated, and a SQLite file is
opened read-only (a full disk, a file of another user's: still readable); only `delete`
opens it for writing.
"""

from __future__ import annotations

import difflib
import functools
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.errors import StorageError, StudyNotFoundError
from autotune.files import atomic_path
from autotune.studies.database import check_url, redact, storage_url

FAIL_REASON = "fail_reason"  # trial user attr: why the trial failed (autotune.studies.tune)
CLOSE_NAMES = 3  # suggestions for a mistyped study name

if TYPE_CHECKING:
    from autotune.studies.rdb import SchemaMismatch

optuna.logging.set_verbosity(optuna.logging.WARNING)


@dataclass
class TrialRow:
    number: int
    state: str
    value: float | None  # None: failed, running, or pruned
    params: dict[str, Any]
    user_attrs: dict[str, Any]  # measured figures, and fail_reason for a failed trial
    started: datetime | None
    completed: datetime | None

    @classmethod
    def of(cls, trial: FrozenTrial) -> TrialRow:
        values = trial.values or []
        value = values[0] if len(values) == 1 and math.isfinite(values[0]) else None
        return cls(
            trial.number,
            trial.state.name,
            value,
            dict(trial.params),
            dict(trial.user_attrs),
            trial.datetime_start,
            trial.datetime_complete,
        )

    @property
    def fail_reason(self) -> str | None:
        return self.user_attrs.get(FAIL_REASON)

    @property
    def duration_s(self) -> float | None:
        if self.started is None or self.completed is None:
            return None
        return (self.completed - self.started).total_seconds()

    @property
    def last_seen(self) -> datetime | None:
        return self.completed or self.started

    def as_dict(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "state": self.state,
            "value": self.value,
            "params": self.params,
            "fail_reason": self.fail_reason,
            "duration_s": None if self.duration_s is None else round(self.duration_s, 3),
            "started": _iso(self.started),
            "completed": _iso(self.completed),
            "user_attrs": self.user_attrs,
        }


@dataclass
class StudySummary:
    name: str
    user_attrs: dict[str, Any]
    direction: str  # "maximize", "minimize", or "multi-objective"
    trials: list[TrialRow]  # best first (see ranked)

    @property
    def best(self) -> TrialRow | None:
        return next((t for t in self.trials if t.state == "COMPLETE" and t.value is not None), None)

    def count(self, state: str) -> int:
        return sum(1 for t in self.trials if t.state == state)

    @property
    def last_update(self) -> datetime | None:
        seen = [t.last_seen for t in self.trials if t.last_seen is not None]
        return max(seen) if seen else None

    @property
    def speedup(self) -> float | None:
        """The best trial's measured speedup (a proxy study's objective is no speedup)."""
        return None if self.best is None else self.best.user_attrs.get("speedup")

    def as_dict(self) -> dict[str, Any]:
        """What `studies list` shows of it, for programs (`-f json|yaml`)."""
        best = self.best
        return {
            "study": self.name,
            "model": self.user_attrs.get("model"),
            "method": self.user_attrs.get("method"),
            "objective": self.user_attrs.get("objective"),
            "direction": self.direction,
            "trials": {
                state.lower(): self.count(state)
                for state in ("COMPLETE", "FAIL", "RUNNING", "WAITING", "PRUNED")
            },
            "best_value": None if best is None else best.value,
            "best_trial": None if best is None else best.number,
            "speedup": self.speedup,
            "last_update": _iso(self.last_update),
        }


def ranked(trials: list[FrozenTrial], direction: str) -> list[TrialRow]:
    """Trials with a value, best first; then the others by number."""
    sign = 1.0 if direction == "minimize" else -1.0
    rows = [TrialRow.of(t) for t in trials]
    return sorted(
        rows, key=lambda r: (r.value is None, 0.0 if r.value is None else sign * r.value, r.number)
    )


def _database_errors(method):
    """A database that fails mid-read (locked, dropped connection): one line, no traceback."""

    @functools.wraps(method)
    def run(self, *args, **kwargs):
        from sqlalchemy.exc import SQLAlchemyError

        try:
            return method(self, *args, **kwargs)
        except (SQLAlchemyError, optuna.exceptions.StorageInternalError) as exc:
            reason = str(exc).strip().splitlines()[0][:200]
            raise StorageError(f"cannot read the study database {self.where}: {reason}") from None

    return run


class StudyDatabase:
    """The studies in one Optuna RDB storage, read through Optuna's own storage API."""

    def __init__(self, url: str | None = None):
        self.url = storage_url(url)
        _require_existing(self.url)
        check_url(self.url)  # an unparsable URL: one line that says how to write one
        self.storage = self._open(read_only=True)

    @property
    def where(self) -> str:
        return redact(self.url)

    @_database_errors
    def names(self) -> list[str]:
        return sorted(s.study_name for s in self.storage.get_all_studies())

    @_database_errors
    def summaries(self) -> list[StudySummary]:
        studies = sorted(self.storage.get_all_studies(), key=lambda s: s.study_name)
        return [
            self._summary(
                self.storage.get_study_id_from_name(s.study_name),
                s.study_name,
                s.user_attrs,
                s.directions,
            )
            for s in studies
        ]

    @_database_errors
    def summary(self, name: str) -> StudySummary:
        study_id = self._study_id(name)
        return self._summary(
            study_id,
            name,
            self.storage.get_study_user_attrs(study_id),
            self.storage.get_study_directions(study_id),
        )

    @_database_errors
    def load(self, name: str) -> optuna.Study:
        self._study_id(name)
        return optuna.load_study(study_name=name, storage=self.storage)

    @_database_errors
    def delete(self, name: str) -> None:
        """The study and its trials; nothing else (the measurement cache stays). The one
        command that writes: it opens the database for writing just for this."""
        self._open(read_only=False).delete_study(self._study_id(name))

    def _open(self, read_only: bool) -> optuna.storages.RDBStorage:
        """The storage as it is: no table created or migrated (SQLite: opened read-only
        unless asked). A schema of another Optuna, or no Optuna database: one line."""
        from sqlalchemy.exc import SQLAlchemyError

        from autotune.studies.rdb import SchemaMismatch, open_existing

        try:
            return open_existing(self.url, read_only=read_only)
        except SchemaMismatch as exc:
            raise StorageError(_schema_line(exc, self.where)) from None
        except (
            SQLAlchemyError,
            optuna.exceptions.StorageInternalError,  # Optuna's wrapper: the cause says why
            ImportError,
            ValueError,
            AssertionError,  # Optuna's version check on a database without its tables
        ) as exc:
            cause = exc.__cause__ or exc
            reason = (str(cause).strip().splitlines() or [type(cause).__name__])[0][:300]
            if "no such table" in reason or "does not exist" in reason:
                raise StorageError(
                    f"{self.where} is no Optuna study database ({reason}); check --storage "
                    "or AUTOTUNE_STORAGE"
                ) from None
            raise StorageError(
                f"cannot open the study database {self.where}: {reason}; "
                "check --storage or AUTOTUNE_STORAGE"
            ) from None

    def _summary(self, study_id: int, name: str, attrs: dict, directions) -> StudySummary:
        direction = directions[0].name.lower() if len(directions) == 1 else "multi-objective"
        trials = self.storage.get_all_trials(study_id, deepcopy=False)
        return StudySummary(name, dict(attrs), direction, ranked(trials, direction))

    def _study_id(self, name: str) -> int:
        try:
            return self.storage.get_study_id_from_name(name)
        except KeyError:
            raise StudyNotFoundError(unknown_study(name, self.names(), self.where)) from None


def _schema_line(exc: SchemaMismatch, where: str) -> str:
    if exc.older:
        return (
            f"the study database {where} has the table schema of an older Optuna "
            f"({exc.current}; Optuna {optuna.__version__} reads {exc.head}): upgrade it with "
            f"`optuna storage upgrade --storage {where}` (a copy first keeps the old one)"
        )
    return (
        f"the study database {where} has the table schema of a newer Optuna "
        f"({exc.current}) than this one ({optuna.__version__}): `pip install -U optuna`"
    )


def unknown_study(name: str, names: list[str], where: str) -> str:
    """One line: the closest names (a prefix of theirs counts too), and where to see all."""
    close = [n for n in names if n.startswith(name.rstrip("/") + "/")]
    close += [
        n
        for n in difflib.get_close_matches(name, names, n=CLOSE_NAMES, cutoff=0.75)
        if n not in close
    ]
    hint = f"; did you mean {', '.join(close[:CLOSE_NAMES])}?" if close else ""
    count = f"{len(names)} {'study' if len(names) == 1 else 'studies'}"
    return (
        f"no study named '{name}' in {where} ({count}){hint} "
        "Run `autotune studies list` to see them all"
    )


def _require_existing(url: str) -> None:
    """A read of a SQLite file that is not there would create an empty database."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError:
        return  # check_url says what is wrong with it
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return
    path = Path(parsed.database).expanduser()
    if not path.is_file():
        raise StorageError(
            f"no study database at {path}: `autotune profile` creates it; "
            "or point --storage (or AUTOTUNE_STORAGE) at an existing one"
        )


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
        methods = data.get("methods") if isinstance(data, dict) else None
        if not isinstance(methods, dict):
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


def _iso(when: datetime | None) -> str | None:
    return None if when is None else when.isoformat()


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
