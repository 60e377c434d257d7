"""Run an Optuna study through Ray Tune: Ray runs the trials, Optuna (bound to the study
database) suggests them. Thin adapter; the objectives live in ``autotune.tuners``.
Imports Ray: import this module only where a study runs.

Faults, and where each is handled:
- a trial that raises (MemoryError and CUDA out-of-memory included) or returns NaN:
  ``_reporting`` and ``RecordingOptunaSearch.on_trial_complete`` record it as FAIL with
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
import math
import os
import socket
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from ray.tune import Callback
from ray.tune.search import Searcher
from ray.tune.search.optuna import OptunaSearch
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from autotune.studies import trials as held
from autotune.studies.trials import fail_stale_trials
from autotune.studies.workers import Workers, trial_resources


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
    its GPUs are found by Ray). Quiet: Ray's log stays in its own files."""
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
    from ray import tune
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
    searcher = RecordingOptunaSearch(
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
    # the bar counts what the budget counts: the study's trials, in the database
    with (
        _progress(label, key, remaining, study) as callback,
        _heartbeat(searcher, study),
    ):
        try:
            tuner = tune.Tuner(
                tune.with_resources(
                    _reporting(objective, spec.threads if spec.timed else None), resources
                ),
                # the searcher says when the budget is spent; this bound only allows for
                # trials queued again (each at most once) and for workers at once
                tune_config=tune.TuneConfig(
                    search_alg=ConcurrencyLimiter(searcher, max_concurrent=at_once),
                    scheduler=scheduler,
                    num_samples=2 * (spec.cap - held.counted(before)) + _waiting(study) + at_once,
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


ATTR_PREFIX = "attr_"
# Keys of every reported result: whether it is the trial's final one (a trial stopped
# after a result that is not was pruned), and how many results came before it, itself
# included (Tune's training_iteration: the step of Optuna's intermediate values).
FINAL = "final"
FIDELITY = "fidelity"
# A progressive objective's result with this key (the reason, in words) is its last: the
# trial stopped itself early, and is pruned as if a scheduler had stopped it.
STOPPED = "stopped"


def budgeted(trials) -> int:
    """Trials that count against a study's ``trials``: those ``held.counted`` counts,
    less the pruned (which count against its cap alone)."""
    trials = list(trials)
    pruned = sum(t.state == optuna.trial.TrialState.PRUNED for t in trials)
    return held.counted(trials) - pruned


def _results(objective, config: dict) -> Iterator[dict]:
    """The results of a trial: those of a progressive objective's ``steps`` as they come,
    or a plain objective's one; the last is final."""
    steps = getattr(objective, "steps", None)
    if steps is None:
        yield objective(config)
        return
    yield from steps(config)


def _reporting(objective: Callable[[dict], dict], threads: int | None = None):
    """Wrap an objective so that every outcome reaches the searcher as a result: a
    crash inside the objective becomes a NaN objective with its reason attached. An
    objective with a ``steps(config)`` method (``methods.studies.Progressive``) reports
    each result it yields; a scheduler may stop it after any but the last."""

    def trainable(config: dict) -> None:
        from ray import tune

        _set_threads(threads)
        full = getattr(objective, "fidelities", 1)  # results of a whole trial
        done, last = 0, None
        try:
            for result in _results(objective, config):
                done, last = done + 1, result
                tune.report(_row(result, done, final=done >= full))
            if last is None:
                raise RuntimeError("the objective gave no result")
        except Exception as exc:  # recorded as a failed trial; the study goes on
            done, last = done + 1, {"objective": math.nan, "fail_reason": _failure(exc)}
            tune.report(_row(last, done, final=True))
            return
        if done < full and STOPPED not in last:  # ended early: its last result is final
            tune.report(_row(last, done + 1, final=True))
        # (a result with STOPPED was reported as not final: the trial is pruned)

    trainable.__name__ = getattr(objective, "__name__", type(objective).__name__)
    return trainable


def _row(result: dict, done: int, *, final: bool) -> dict:
    from autotune.process_cache import built

    # which worker ran it, and how often that worker has loaded the target (once)
    result = {
        **result,
        "worker": f"{socket.gethostname()}:{os.getpid()}",
        "target_loads": built("target"),
    }
    return {
        "objective": result.get("objective", math.nan),
        FINAL: final,
        FIDELITY: done,
        **{ATTR_PREFIX + k: v for k, v in result.items()},
    }


def _failure(exc: Exception) -> str:
    """The reason of a failed trial; out of memory is said so, and memory given back."""
    reason = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        import gc

        gc.collect()
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            torch.cuda.empty_cache()
        reason = f"out of memory: {reason}"
    return reason[:500]


def _set_threads(threads: int | None) -> None:
    """Torch threads of this trial: ``threads``, or the cores it reserved (Ray sets
    OMP_NUM_THREADS to those when it starts a worker, before torch is imported)."""
    if threads:
        import torch

        torch.set_num_threads(threads)
        return
    loaded = sys.modules.get("torch")
    if loaded is None:
        return
    import ray

    cpus = ray.get_runtime_context().get_assigned_resources().get("CPU")
    if cpus:
        loaded.set_num_threads(max(1, int(cpus)))


class RecordingOptunaSearch(OptunaSearch):
    """OptunaSearch that
    - stops asking once the study (in the database, all processes together) has
      ``budget`` counted trials (``budgeted``: pruned ones not) or ``cap`` counted trials
      of every kind, or the trials running could reach either (waiting for its own,
      which may yet fail, be pruned or be queued again);
    - marks each trial it asks for as held by this process (``trials.claim``);
    - keeps each trial's reported figures as user attributes;
    - records a NaN or failed trial as FAIL with its reason (OptunaSearch would swallow
      Optuna's refusal of NaN and leave the trial RUNNING);
    - records a trial that a scheduler stopped after a result that was not its final one
      as PRUNED, its intermediate values reported (OptunaSearch would record it COMPLETE
      with its partial figure);
    - fails a trial whose worker died, or that Tune stopped before it reported, and
      queues its parameters again;
    - writes no checkpoint: the study database is the checkpoint (and a pickled storage
      is how a password would reach the disk)."""

    def __init__(self, *args, budget: int, cap: int | None = None, key: str = "", **kwargs):
        if not kwargs.get("study_name"):  # OptunaSearch would call every study "optuna"
            raise ValueError("RecordingOptunaSearch needs an explicit study_name")
        super().__init__(*args, **kwargs)
        self._budget = budget
        self._cap = max(budget, cap or 0)
        self._key = key
        self._checked = -math.inf  # monotonic time of the last "wait" verdict

    def suggest(self, trial_id):
        if trial_id not in self._ot_trials:
            verdict = self._budget_verdict()
            if verdict is not True:
                return verdict
        params = super().suggest(trial_id)
        held.claim(self._ot_trials[trial_id])
        return params

    def _budget_verdict(self):
        """True: ask for a trial; FINISHED: the budget is spent; None: not now."""
        if time.monotonic() - self._checked < 1.0:
            time.sleep(0.1)  # Tune asks again at once: don't spin while waiting
            return None
        trials = self._study().get_trials(deepcopy=False)
        counted, done = held.counted(trials), budgeted(trials)
        if done >= self._budget or counted >= self._cap:
            return Searcher.FINISHED
        running = [t._trial_id for t in trials if t.state == optuna.trial.TrialState.RUNNING]
        if done + len(running) >= self._budget or counted + len(running) >= self._cap:
            if not set(running) & set(self.held_trial_ids()):
                # the rest is in other processes' hands; waiting here would keep this
                # run's idle workers, and so the cores their trials wait for
                return Searcher.FINISHED
            self._checked = time.monotonic()  # ours may yet fail and be queued again
            return None
        return True

    def _study(self) -> optuna.Study:
        if self._ot_study is None:
            raise RuntimeError("the searcher has no study yet: Tune sets it up before asking")
        return self._ot_study

    def held_trial_ids(self) -> list[int]:
        return [
            t._trial_id
            for tid, t in list(self._ot_trials.items())
            if tid not in self._completed_trials
        ]

    def on_trial_complete(self, trial_id, result=None, error=False):
        ot_trial = self._ot_trials.get(trial_id)
        if ot_trial is None or trial_id in self._completed_trials:
            return None
        self._completed_trials.add(trial_id)
        self._checked = -math.inf
        # failed meanwhile as stale by another process: nothing to record
        with contextlib.suppress(UpdateFinishedTrialError):
            self._record(trial_id, ot_trial, result, error)
        return None

    def _record(self, trial_id, ot_trial, result, error) -> None:
        result = result or {}
        value = result.get("objective")
        if error or value is None:
            reason = (
                _worker_error(self._key, trial_id)
                if error
                else "stopped before it reported (time budget spent, or the run was interrupted)"
            )
            self._release(ot_trial, reason)
            return
        for key, attr in result.items():
            if key.startswith(ATTR_PREFIX) and isinstance(
                attr, (bool, int, float, str, list, dict)
            ):
                ot_trial.set_user_attr(key[len(ATTR_PREFIX) :], attr)
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            if not result.get(ATTR_PREFIX + "fail_reason"):
                ot_trial.set_user_attr("fail_reason", f"objective was {value!r}")
            self._study().tell(ot_trial, None, state=optuna.trial.TrialState.FAIL)
            return
        # Tune passes a result at which a scheduler stops the trial to on_trial_complete
        # alone: Optuna hears of it here (a step already reported is ignored)
        step = result.get("training_iteration") or result.get(FIDELITY) or 1
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ot_trial.report(float(value), int(step))
        if result.get(FINAL) is False:  # a scheduler stopped it: Optuna's word is pruned
            self._study().tell(ot_trial, state=optuna.trial.TrialState.PRUNED)
            return
        self._study().tell(ot_trial, float(value))

    def _release(self, ot_trial, reason: str) -> None:
        study = self._study()
        frozen = study._storage.get_trial(ot_trial._trial_id)
        held.fail_and_requeue(study, frozen, reason)

    def release_unfinished(self, reason: str) -> None:
        """Trials this run asked for and never heard of again (Tune ends a run without
        telling the searcher about the trials it stops)."""
        if self._ot_study is None:
            return
        for tid, ot_trial in list(self._ot_trials.items()):
            if tid in self._completed_trials:
                continue
            self._completed_trials.add(tid)
            with contextlib.suppress(UpdateFinishedTrialError):
                self._release(ot_trial, reason)

    def save(self, checkpoint_path: str):
        raise NotImplementedError("the study database is the checkpoint")


def _worker_error(key: str, trial_id: str) -> str:
    """Why Ray lost a trial, from the error Tune wrote for it."""
    trial = _RUNS.get(key, {}).get("trials", {}).get(trial_id)
    text = ""
    path = getattr(trial, "error_file", None)
    if path and os.path.exists(path):
        with open(path, errors="replace") as stream:
            text = stream.read()
    # e.g. "ray.exceptions.ActorDiedError: The actor died unexpectedly ...", then
    # "The actor is dead because its worker process has died. Worker exit type: ..."
    errors = [line.strip() for line in text.splitlines() if line.startswith("ray.exceptions.")]
    causes = [line.strip().split(". ")[0] for line in text.splitlines() if " because " in line]
    detail = "; ".join(dict.fromkeys(errors[-1:] + causes[-1:]))
    # Ray's memory monitor killed it (not merely Ray's list of "common causes")
    memory = "out of memory: " if "OutOfMemoryError" in text else ""
    return (f"{memory}the Ray worker running it died" + (f" ({detail})" if detail else ""))[:400]


def _run_name(study_name: str) -> str:
    """A Ray experiment folder of its own for each run: two processes on one study must
    not share one."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return f"{study_name.replace('/', '__').replace(':', '_')}-{stamp}-{os.getpid()}"


def _ray_results_dir() -> str:
    """Ray Tune's experiment folders. Nothing there is read back: resuming goes
    through the study database."""
    path = os.environ.get("AUTOTUNE_RAY_RESULTS") or os.path.join(
        tempfile.gettempdir(), "autotune-ray"
    )
    os.makedirs(path, exist_ok=True)
    return path


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


_RUNS: dict[str, dict] = {}  # Tune pickles its callbacks: they hold a key, not the bar


class _RunCallback(Callback):
    """Keeps Tune's trials at hand (their error files say why a worker died) and
    advances a rich progress bar as Ray Tune finishes trials."""

    def __init__(self, key: str):
        self.key = key

    def on_trial_start(self, iteration, trials, trial, **info):
        if self.key in _RUNS:
            _RUNS[self.key]["trials"][trial.trial_id] = trial

    def _advance(self, trial) -> None:
        if self.key not in _RUNS:
            return
        run = _RUNS[self.key]
        last = trial.last_result or {}
        value = last.get("objective") if last.get(FINAL, True) else None  # pruned: partial
        if value is not None and math.isfinite(value) and value > run["best"]:
            run["best"] = value
            run["bar"].update(run["task"], best=f"{value:.3f}")
        _count(run)

    def on_trial_complete(self, iteration, trials, trial, **info):
        self._advance(trial)

    def on_trial_error(self, iteration, trials, trial, **info):
        self._advance(trial)


def _count(run: dict) -> None:
    """The bar at the study's counted trials since the run began (a trial queued again
    counts once, through its re-run; another process's trials on the study count too:
    the budget is the study's)."""
    with contextlib.suppress(Exception):  # a database hiccup costs a bar update, no more
        done = budgeted(run["study"].get_trials(deepcopy=False)) - run["before"]
        run["bar"].update(run["task"], completed=max(0, min(done, run["total"])))


class _progress:
    def __init__(self, label: str, key: str, total: int, study):
        self.label, self.key, self.total, self.study = label, key, total, study

    def __enter__(self) -> _RunCallback:
        from autotune.progress import console

        bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TextColumn("best {task.fields[best]}"),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=console,
        )
        task = bar.add_task(self.label, total=self.total, best="-")
        before = budgeted(self.study.get_trials(deepcopy=False))
        _RUNS[self.key] = {
            "bar": bar,
            "task": task,
            "best": -math.inf,
            "trials": {},
            "study": self.study,
            "before": before,
            "total": self.total,
        }
        bar.start()
        return _RunCallback(self.key)

    def __exit__(self, *exc):
        run = _RUNS.pop(self.key)
        _count(run)
        run["bar"].stop()
        return False
