"""`autotune heads train`: check the inputs, load the target, train heads of one kind,
write the heads folder with a record of how they were made."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from autotune import plan
from autotune.cache_entry import CacheEntry
from autotune.errors import AutotuneError, OutputPathError
from autotune.heads.cache import heads_entry
from autotune.paths import cache_folder
from autotune.progress import say
from autotune.training.calibration import (
    answer_cache,
    answered,
    decode_calibration,
    search_thirds,
)
from autotune.training.kinds import KINDS as HEAD_KINDS
from autotune.training.kinds import kind as head_kind
from autotune.training.loss import loss_dtype
from autotune.training.trainer import TrainResult

KINDS = tuple(HEAD_KINDS)


def trained_on(heads_dir, prompts_path) -> set[str]:
    """Ids of the prompts in ``prompts_path`` whose answers trained the heads (empty when
    they were trained on another file, or not by autotune)."""
    import json

    try:
        record = json.loads((Path(heads_dir) / "config.json").read_text())["autotune"]["prompts"]
    except (OSError, ValueError, KeyError, TypeError):
        return set()
    if Path(record.get("file", "")).resolve() != Path(prompts_path).resolve():
        return set()
    return set(record.get("trained_on", []))


def default_options(kind: str):
    """The options a head kind trains with unless told otherwise."""
    return head_kind(kind).options()


def check_out_folder(folder: Path) -> None:
    """Fail before any long work if the heads could not be written to ``folder`` (it is
    created now, as ``autotune profile`` creates its output's folder)."""
    if folder.exists() and not folder.is_dir():
        raise OutputPathError(f"{folder} is a file; --out needs a folder for the heads")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputPathError(
            f"cannot create {folder}: {exc.strerror}; choose another --out"
        ) from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputPathError(f"{folder} is not writable; choose another --out")


@dataclass(frozen=True)
class HeadsJob:
    """What ``autotune heads train`` was asked to do."""

    kind: str
    model: str
    model_path: str | None = None
    prompts: str | None = None
    out: Path | None = None
    options: Any = None  # MedusaOptions, EagleOptions or GlideOptions; None: the defaults
    dtype: str = "float32"
    device: str = "cpu"


def run_heads_train(job: HeadsJob):
    """Check every input (cheap), then load the target, train, save the heads folder.
    Medusa heads, an EAGLE head or a GLIDE draft, as ``job.kind`` says (the result has
    the same fields)."""
    from autotune.engine.runner import Runner
    from autotune.models import load_target, resolve_model
    from autotune.models.registry import fingerprint
    from autotune.prompts import default_prompts_path, load_prompts

    started = time.perf_counter()
    defaults = default_options(job.kind)
    options = defaults if job.options is None else job.options
    if type(options) is not type(defaults):
        raise ValueError(
            f"{job.kind} heads take {type(defaults).__name__}, not {type(options).__name__}"
        )
    prompts_path = Path(job.prompts).expanduser() if job.prompts else default_prompts_path()
    prompts = load_prompts(prompts_path)
    if len(prompts) < 2:
        raise AutotuneError(
            f"{prompts_path} has one prompt: heads need at least two "
            "(one to train on, one held back to measure them)"
        )
    loss_dtype(options.loss_dtype)
    resolved = resolve_model(job.model, job.model_path)
    out, entry = _heads_destination(job, fingerprint(resolved))
    say(f"loading {resolved.name} from {resolved.path}")
    target = load_target(job.model, job.model_path, job.dtype, job.device)
    # the packaged prompts calibrate together (those whose answers fit the time); a
    # user's own file is their workload alone
    extras, keep = [], None
    runner = Runner(target.model)  # decodes the answers (``distill.decode_answers``)
    if job.prompts is None:
        seconds = (
            None if options.time_budget_s is None else plan.ANSWERS_SHARE * options.time_budget_s
        )
        extras = decode_calibration(
            target, runner, prompts_path, prompts, options.max_new_tokens, seconds
        ).extras
        keep = answered(target, options.max_new_tokens)  # what fitted the answers' time
    trained = train_heads_on(
        target, job.kind, options, prompts_path, prompts, extras, started, keep, runner
    )
    if entry is None:
        save_heads(trained, job.kind, options, target, resolved, prompts_path, out)
    else:
        with entry.writing() as staged:  # whole or not at all, with its record
            save_heads(trained, job.kind, options, target, resolved, prompts_path, staged)
    return trained.result, out


def _heads_destination(job: HeadsJob, model_fingerprint: str) -> tuple[Path, CacheEntry | None]:
    """Where the heads go, checked before any long work: the --out folder, or their entry
    in the heads cache (its parent made now: a cache place that cannot be used is one
    line naming $AUTOTUNE_CACHE)."""
    if job.out is not None:
        check_out_folder(job.out)
        return job.out, None
    cache_folder("heads", model_fingerprint)
    entry = heads_entry(model_fingerprint, job.kind)
    return entry.path, entry


def cached_heads_folder(model_fingerprint: str, kind: str) -> Path:
    """autotune's heads cache: where `heads train` (by default) and `profile` keep the
    heads trained for a model, and where `profile` looks for them. Heads there that are
    not as they were written are said, moved aside: the caller finds none, and trains."""
    entry = heads_entry(model_fingerprint, kind)
    entry.usable(
        f"new ones are trained by this run if it trains heads, else by `autotune heads train "
        f"--kind {kind}`"
    )
    return entry.path


@dataclass
class TrainedHeads:
    """A trainer's result, with what it was trained on."""

    result: TrainResult
    trained_on: list[str]  # ids of the workload's prompts among the training prompts
    split: tuple[int, int]  # prompts trained on, prompts held back for the report
    extras: int  # calibration prompts from other files among those trained on


def training_lists(
    prompts: list, extras: list, keep: Callable[[list], list] | None = None
) -> tuple[list, list, list, list]:
    """(workload prompts trained on, every prompt trained on, reported on, followups):
    two thirds of the search split of ``prompts`` and the calibration ``extras`` to train
    on, second turns after their first; the other third of the search split to report
    the heads' accuracy on (what `profile` measures them on too; the held-back split
    only when that third is empty: it stays unseen by the heads). ``keep`` filters the
    prompts to train and report on (``answered``: those whose answers are cached)."""
    trained, unseen, held_back = search_thirds(prompts)
    reported = unseen or held_back
    keep = keep or (lambda ps: ps)
    trained, extras, reported = keep(trained), keep(extras), keep(reported)
    # second turns follow their first: answers to them need the first answers in context
    train_on = sorted(trained + extras, key=lambda p: not p.followups)
    followups = [(p.text, p.followups[0]) for p in train_on if p.followups]
    return trained, train_on, reported, followups


def train_kind(ws, extras: list, answer_tokens: int, kind: str, seconds: float | None) -> Path:
    """Train heads of ``kind`` within ``seconds`` on the workload's prompts and ``extras``
    (their answers ``answer_tokens`` long, from the shared set) and keep them in
    autotune's heads cache (replaced whole: a killed run leaves the old folder or none)."""
    import dataclasses

    from autotune.models import resolve_model
    from autotune.progress import console
    from autotune.training.report import accuracy_table

    options = dataclasses.replace(
        default_options(kind), max_new_tokens=answer_tokens, time_budget_s=seconds
    )
    target = ws.target
    trained = train_heads_on(
        target,
        kind,
        options,
        ws.prompts_path,
        ws.prompts,
        extras,
        time.perf_counter(),
        keep=answered(target, answer_tokens),
        runner=ws.runner,
    )
    entry = heads_entry(target.fingerprint, kind)
    resolved = resolve_model(ws.ref.spec, ws.ref.model_path)
    with entry.writing() as staged:
        save_heads(trained, kind, options, target, resolved, ws.prompts_path, staged)
    final = entry.path
    result = trained.result
    console.print(
        accuracy_table(
            result.accuracy,
            f"{kind}: trained {result.stats.epochs:.1f} epochs on {result.train_tokens} "
            f"answer tokens; held-back accuracy",
        )
    )
    return final


@dataclass(frozen=True)
class HeadProbe:
    """What a short training of a head kind shows: held-back top-1 and top-5 accuracy
    per head (or depth, or step), the seconds it trained, and one drafting level's
    seconds with what it trained (0: not measured, drafting taken as free)."""

    top1: list[float]
    top5: list[float]
    trained_s: float
    level_s: float


def probe_kind(ws, answer_tokens: int, kind: str, seconds: float) -> HeadProbe:
    """Heads of ``kind`` trained for ``seconds`` on the search split's answers alone,
    timed drafting, and thrown away: what ``profile`` bounds a head method by before it
    spends the method's whole training time."""
    import dataclasses

    options = dataclasses.replace(
        default_options(kind), max_new_tokens=answer_tokens, time_budget_s=seconds
    )
    started = time.perf_counter()
    trained = train_heads_on(
        ws.target,
        kind,
        options,
        ws.prompts_path,
        ws.prompts,
        [],
        started,
        keep=answered(ws.target, answer_tokens),
        runner=ws.runner,
    )
    trained_s = time.perf_counter() - started
    rows = trained.result.accuracy
    try:
        level_s = trained.result.level_seconds(ws.runner)
    except RuntimeError:  # e.g. heads kept in another dtype than the target's: as free
        level_s = 0.0
    return HeadProbe(
        [float(r.top1) for r in rows], [float(r.top5) for r in rows], trained_s, level_s
    )


def train_heads_on(
    target,
    kind: str,
    options,
    prompts_path: Path,
    prompts: list,
    extras: list,
    started: float | None = None,
    keep: Callable[[list], list] | None = None,
    runner=None,
) -> TrainedHeads:
    """Train heads of ``kind`` for a loaded target on two thirds of the search split of
    ``prompts`` (the rest is left for `profile` to measure them on) and the calibration
    ``extras``; the target's answers come from the model's shared self-distillation set.
    ``keep``: as ``training_lists`` takes it; ``runner``: the engine that decodes the
    answers the set lacks (None: one is made where any is lacking)."""
    search, train_on, reported, followups = training_lists(prompts, extras, keep)
    result = head_kind(kind).train()(
        target,
        [target.encode_chat(p.text) for p in train_on],
        [target.encode_chat(p.text) for p in reported],
        options,
        started,
        followups,
        answer_cache(target.fingerprint),
        runner,
    )
    return TrainedHeads(result, [p.id for p in search], (len(train_on), len(reported)), len(extras))


def save_heads(
    trained: TrainedHeads, kind: str, options, target, resolved, prompts_path: Path, out: Path
) -> None:
    """Write the heads folder, with the record of how they were made."""
    from autotune.models import ALIASES

    # upstream configs name the Hugging Face repo; a local model is named by its path
    base = resolved.source if resolved.source in ALIASES.values() else str(resolved.path)
    record = _record(
        kind, options, target, prompts_path, trained.split, trained.result, trained.trained_on
    )
    record["prompts"]["calibration_extras"] = trained.extras
    trained.result.save(out, target, base, {"autotune": record})


def _record(
    kind: str,
    options,
    target,
    prompts_path: Path,
    split: tuple[int, int],
    result,
    trained_on: list[str],
) -> dict:
    """What config.json's "autotune" key says about how the heads were made."""
    stats = result.stats
    trainer = result.trainer
    return {
        **trainer.shape_record(result.trained),
        "trained_by": f"autotune heads train --kind {kind}",
        "method": trainer.METHOD,
        "model": target.name,
        "model_fingerprint": target.fingerprint,
        "prompts": {
            "file": str(prompts_path.resolve()),
            "train": split[0],
            "held_back": split[1],
            "trained_on": trained_on,
        },
        "tokens": {
            "max_new_tokens": options.max_new_tokens,
            "train": result.train_tokens,
            "held_back": result.held_back_tokens,
        },
        "training": {
            "epochs": round(stats.epochs, 3),
            "steps": stats.steps,
            "stopped_by_time": stats.stopped_by_time,
            trainer.LOSS: stats.losses[-1] if stats.losses else None,
        },
        "options": {
            **asdict(options),
            "loss_dtype": str(loss_dtype(options.loss_dtype)).removeprefix("torch."),
        },
        "accuracy_held_back": [asdict(row) for row in result.accuracy],
        "seconds": {k: round(v, 1) for k, v in result.seconds.items()},
    }
