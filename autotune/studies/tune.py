"""Run an Optuna study through Ray Tune: Ray runs the trials, Optuna (bound to the study
database) suggests them. Thin adapter; the objectives live in ``autotune.tuners``.
Imports Ray: import this module only where a study runs.

Faults, and where each is handled:
- a trial that raises (MemoryError and CUDA out-of-memory included) or returns NaN:
  ``studies.trainable.reporting`` and ``RecordingOptunaSearch.on_trial_complete``
  (``studies.search``) record it as FAIL with
  its reason (Optuna refuses NaN in ``tell`` and OptunaSearch swallows that refusal,
  which would leave the trial RUNNING); the study goes on;
- a trial that a scheduler (ASHA) stops after an intermediate result: PRUNED, not
  counted against the study's trials (only against its cap);
- a Ray worker or node that dies under a trial, or a trial Tune stops before it reports
  (time budget, Ctrl-C): FAIL with the reason, parameters queued once more;
- a `profile` process that dies: its RUNNING trials are failed and queued again by the
  next run, or by a run beside it (``autotune.studies.trials``);
- two processes on one study: trial numbers and queued trials are Optuna's, under row
  locks; the trial budget is the study's, counted in the database, so together they run
  it once;
- the database password: the storage pickles without it (``autotune.studies.rdb``) and
  the searcher writes no checkpoint of its own (the study database is the checkpoint).
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import optuna

from autotune.studies import trials as held
from autotune.studies.run_progress import RunProgress
from autotune.studies.search import RecordingOptunaSearch
from autotune.studies.trainable import STOPPED, reporting
from autotune.studies.trials import budgeted, fail_stale_trials
from autotune.studies.workers import Workers, trial_resources

# importers of this module's names from before the run's parts had modules of their own
__all__ = [
    "STOPPED",
    "RecordingOptunaSearch",
    "StudySpec",
    "budgeted",
    "fail_stale_trials",
    "init_ray",
    "open_study",
    "run_study",
]


@dataclass
class StudySpec:
    name: str  # always explicit: OptunaSearch's default is "optuna"
    storage_url: str
    space: dict[str, Any]  # parameter name -> optuna distribution
    metric: str
    trials: int  # total wanted, counting trials finished in earlier runs (pruned ones not)
    sampler: Any = None
    seeds: list[dict] = field(default_factory=list)
    time_budget_s: float | None = None
    timed: bool = False  # the objective measures wall-clock time
    threads: int | None = None  # torch threads of a timed trial: the main process's, so
    # trial timings compare with its own (default: cores reserved)
    user_attrs: dict[str, Any] = field(default_factory=dict)
    max_trials: int | None = None  # finished trials at most, pruned ones included
    # (default: ``trials``; a study whose scheduler prunes needs more)

    @property
    def cap(self) -> int:
        return max(self.trials, self.max_trials or 0)


optuna.logging.set_verbosity(optuna.logging.WARNING)
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
# Ray's searcher asks and tells; this process beats for what it holds (studies.trials)
warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with")


def init_ray(address: str | None = None) -> None:
    """Join the cluster at ``address`` (or ``$RAY_ADDRESS``, or the one ``ray start`` left
    running here), or start a local Ray instance sized to this machine (all its cores;
    the GPUs torch sees). Quiet: Ray's log stays in its own files."""
    import ray

    from autotune.errors import AutotuneError
    from autotune.studies.cluster import ray_target

    if ray.is_initialized():
        return
    target = ray_target(address)  # checked reachable: a bad address fails here, at once
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    # Ctrl-C stops `profile`, not only the study under way (Tune would swallow it, and
    # the next step would start); the trials it stops are queued again for the next run
    os.environ.setdefault("TUNE_DISABLE_SIGINT_HANDLER", "1")
    # SIGTERM is ours to report in one line (as Ctrl-C): Ray's handler would print its
    # own stack first
    os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
    quiet: dict[str, Any] = {
        "log_to_driver": False,
        "configure_logging": True,
        "logging_level": logging.ERROR,
    }
    try:
        if target.local:
            # resources are ours to say only for an instance we start: Ray refuses them
            # when joining a cluster, whose nodes say their own
            from ray._private import ray_constants

            before = ray_constants.ENABLE_RAY_CLUSTER
            try:
                ray.init(**target.local_options(), **quiet)
            finally:
                # only the instance started here is single-machine: a cluster joined
                # later in this process (a test's) is one again
                ray_constants.ENABLE_RAY_CLUSTER = before
        else:
            ray.init(address=target.address, **quiet)
    except (ConnectionError, RuntimeError, ValueError, TimeoutError) as exc:
        where = "a local Ray instance" if target.local else f"the Ray cluster at {target.address}"
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise AutotuneError(
            f"cannot start {where} ({target.source}): {first}"
            if target.local
            else f"cannot join {where} ({target.source}): {first}; check that it runs the "
            "same Ray version, or fix the address"
        ) from None


def _waiting(study) -> int:
    return len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)))


def _nodes() -> list[dict]:
    import ray

    return [n["Resources"] for n in ray.nodes() if n.get("Alive")]


def open_study(spec: StudySpec) -> optuna.Study:
    """The study in the database (created on first use), its attributes set and the
    trials nobody holds any more failed and queued again; no trial is run."""
    from autotune.studies.storage import open_storage

    storage = open_storage(spec.storage_url)
    study = optuna.create_study(
        study_name=spec.name, storage=storage, direction="maximize", load_if_exists=True
    )
    for key, value in spec.user_attrs.items():
        study.set_user_attr(key, value)
    # optuna-dashboard (`autotune studies dashboard`) labels the objective with this
    label = spec.user_attrs.get("objective")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names([label if isinstance(label, str) and label else spec.metric])
    fail_stale_trials(study)
    return study


def run_study(
    spec: StudySpec,
    objective: Callable[[dict], dict],
    *,
    label: str,
    workers: Workers = Workers(),
    scheduler: Any = None,
):
    """Run until ``spec.trials`` trials have finished in the study, counting those of
    earlier runs and of runs beside this one, or ``spec.cap`` trials pruned ones
    included (or until the time budget is spent); return the Optuna study.

    ``scheduler``: a Ray Tune scheduler (e.g. ``ASHAScheduler`` on ``metric="objective"``,
    ``mode="max"``) that may stop a trial after one of its intermediate results. The
    objective then reports as it goes (``Progressive``); a trial it stops is PRUNED in
    the study, and counts against the cap but not against ``spec.trials``."""
    from ray.tune.search import ConcurrencyLimiter

    study = open_study(spec)
    storage = study._storage
    before = study.get_trials(deepcopy=False)
    remaining = spec.trials - budgeted(before)
    if remaining <= 0 or held.counted(before) >= spec.cap:
        return study
    for seed in spec.seeds:  # seeds already tried (or queued) here or elsewhere are skipped
        study.enqueue_trial(seed, skip_if_exists=True)
    init_ray(workers.ray_address)
    resources, at_once = trial_resources(workers, spec.timed, _nodes())
    key = f"{label}:{os.getpid()}:{time.monotonic()}"
    searcher = _searcher(spec, storage, key)
    # the bar counts what the budget counts: the study's trials, in the database
    with (
        RunProgress(label, key, remaining, study) as callback,
        _heartbeat(searcher, study),
    ):
        try:
            # the searcher says when the budget is spent; this bound only allows for
            # trials queued again (each at most once) and for workers at once
            samples = 2 * (spec.cap - held.counted(before)) + _waiting(study) + at_once
            tuner = _tuner(
                spec,
                _trial(spec, objective, resources),
                ConcurrencyLimiter(searcher, max_concurrent=at_once),
                scheduler,
                samples,
                callback,
            )
            # Ray prints a banner on stdout whatever its verbosity, with num_samples (a bound
            # that allows for re-runs) as its "Number of trials": the bar alone counts, and
            # stdout stays for our results (--json)
            with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
                tuner.fit()
        finally:
            searcher.release_unfinished(
                "stopped before it finished (time budget spent, or the run was interrupted)"
            )
    return optuna.load_study(study_name=spec.name, storage=storage)


def _searcher(spec: StudySpec, storage, key: str) -> RecordingOptunaSearch:
    """The study's searcher, bound to its database and budget; ``key``: the run's."""
    return RecordingOptunaSearch(
        space=spec.space,
        metric=spec.metric,
        mode="max",
        sampler=spec.sampler,
        study_name=spec.name,
        storage=storage,
        budget=spec.trials,
        cap=spec.cap,
        key=key,
    )


def _trial(spec: StudySpec, objective: Callable[[dict], dict], resources):
    """The objective as Tune runs it: reporting every outcome, on ``resources``."""
    from ray import tune

    return tune.with_resources(
        reporting(objective, spec.threads if spec.timed else None), resources
    )


def _tuner(spec: StudySpec, trial, search_alg, scheduler, samples: int, callback):
    """Tune's run of the study: at most ``samples`` trials, none retried by Tune (the
    searcher queues a lost trial again), its experiment folder of its own."""
    from ray import tune

    return tune.Tuner(
        trial,
        tune_config=tune.TuneConfig(
            search_alg=search_alg,
            scheduler=scheduler,
            num_samples=samples,
            time_budget_s=spec.time_budget_s,
            reuse_actors=True,
        ),
        run_config=tune.RunConfig(
            name=_run_name(spec.name),
            verbose=0,
            storage_path=_ray_results_dir(),
            callbacks=[callback],
            failure_config=tune.FailureConfig(max_failures=0),
        ),
    )


def _run_name(study_name: str) -> str:
    """A Ray experiment folder of its own for each run: two processes on one study must
    not share one."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return f"{study_name.replace('/', '__').replace(':', '_')}-{stamp}-{os.getpid()}"


RAY_RESULTS_ENV = "AUTOTUNE_RAY_RESULTS"


def _ray_results_dir() -> str:
    """Ray Tune's experiment folders. Nothing there is read back (resuming goes through
    the study database), so a default place that cannot be used (a file in the way,
    another user's folder) is passed over for a new folder; a place the user set that
    cannot be used is one line naming $AUTOTUNE_RAY_RESULTS."""
    from autotune.errors import AutotuneError

    explicit = os.environ.get(RAY_RESULTS_ENV)
    path = explicit or os.path.join(tempfile.gettempdir(), "autotune-ray")
    problem = _unusable_folder(path)
    if problem is None:
        return path
    hint = f"set {RAY_RESULTS_ENV} to a folder autotune can write"
    if explicit:
        raise AutotuneError(f"cannot use {path} for Ray Tune's results: {problem}; {hint}")
    try:
        return tempfile.mkdtemp(prefix="autotune-ray-")
    except OSError as exc:
        from autotune.files import reason

        raise AutotuneError(
            f"cannot make a folder for Ray Tune's results in {tempfile.gettempdir()}: "
            f"{reason(exc)}; {hint}"
        ) from None


def _unusable_folder(path: str) -> str | None:
    """Why ``path`` cannot hold Ray's experiment folders, in words; None when it can."""
    from autotune.files import reason

    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        return reason(exc)
    if not os.path.isdir(path):
        return "it is not a folder"
    if not os.access(path, os.W_OK | os.X_OK):
        return "permission denied"
    return None


@contextlib.contextmanager
def _heartbeat(searcher: RecordingOptunaSearch, study):
    """While the run lasts: a heartbeat for the trials it holds, and now and then a look
    for trials that a process beside it left behind."""
    stop = threading.Event()

    def beat() -> None:
        last_scan = time.monotonic()
        while not stop.wait(held.HEARTBEAT_S):
            with contextlib.suppress(Exception):  # a missed beat is not worth a crash
                held.beat(study._storage, searcher.held_trial_ids())
                if time.monotonic() - last_scan > 3 * held.HEARTBEAT_S:
                    fail_stale_trials(study)
                    last_scan = time.monotonic()

    thread = threading.Thread(target=beat, name="autotune-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)
