"""`autotune heads train`: check the inputs, load the target, train heads of one kind,
write the heads folder with a record of how they were made."""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from autotune import plan
from autotune.errors import AutotuneError, OutputPathError
from autotune.progress import say
from autotune.training.kinds import KINDS as HEAD_KINDS
from autotune.training.kinds import kind as head_kind
from autotune.training.loss import loss_dtype

KINDS = tuple(HEAD_KINDS)


def heads_split(search: list) -> list:
    """The part of the search split heads are trained on (two thirds, by category)."""
    from autotune.prompts import split_prompts

    if len(search) < 3:
        return search
    return split_prompts(search, held_back_fraction=1 / 3, seed=1)[0]


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


def check_kind(kind: str) -> None:
    head_kind(kind)


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
    out = job.out or cached_heads_folder(fingerprint(resolved), job.kind)
    check_out_folder(out)
    say(f"loading {resolved.name} from {resolved.path}")
    target = load_target(job.model, job.model_path, job.dtype, job.device)
    # the packaged prompts calibrate together (those whose answers fit the time); a
    # user's own file is their workload alone
    extras, keep = [], None
    if job.prompts is None:
        seconds = (
            None if options.time_budget_s is None else plan.ANSWERS_SHARE * options.time_budget_s
        )
        extras = decode_calibration(
            target, prompts_path, prompts, options.max_new_tokens, seconds
        ).extras
        keep = answered(target, options.max_new_tokens)  # what fitted the answers' time
    trained = train_heads_on(
        target, job.kind, options, prompts_path, prompts, extras, started, keep
    )
    save_heads(trained, job.kind, options, target, resolved, prompts_path, out)
    return trained.result, out


def cached_heads_folder(model_fingerprint: str, kind: str) -> Path:
    """autotune's heads cache: where `heads train` (by default) and `profile` keep the
    heads trained for a model, and where `profile` looks for them."""
    from autotune.paths import cache_root

    return cache_root() / "heads" / model_fingerprint / kind


def answer_cache(model_fingerprint: str):
    """The shared self-distillation set of a model (``training.distill.AnswerCache``)."""
    from autotune.paths import cache_root
    from autotune.training.distill import AnswerCache

    return AnswerCache(cache_root() / "answers", model_fingerprint)


# Batched decoding of the calibration answers against one greedy sequence, in tokens per
# second (measured on 2 cores, SmolLM2-135M, batches of 16: ~140 against ~35).
BATCHED_DECODING_GAIN = 4.0
# Of a training job's time, what decoding the shared answers may take at most.


def answers_seconds(forward_s: float, answer_tokens: int, prompts: list) -> float:
    """Decoding the shared answers to ``prompts`` in batches, given one greedy forward's
    time (a prompt with a second turn is answered twice)."""
    per_answer = answer_tokens * forward_s / BATCHED_DECODING_GAIN
    return sum(per_answer * (1 + bool(p.followups)) for p in prompts)


def calibration_extras(prompts_path: Path, count: int | None = None) -> list:
    """The packaged calibration prompts that are not the workload's own file (MT-bench
    chat and the Spec-Bench development set's input-grounded tasks): heads train on them
    too, so they see more than one kind of request. ``count``: that many, spread evenly."""
    from autotune.prompts import load_prompts, packaged_prompt_files

    extras = [
        prompt
        for path in packaged_prompt_files()
        if path.resolve() != prompts_path.resolve()
        for prompt in load_prompts(path)
    ]
    if count is None or count >= len(extras):
        return extras
    return [extras[i * len(extras) // count] for i in range(count)]


@dataclass
class TrainedHeads:
    """A trainer's result, with what it was trained on."""

    result: Any  # MedusaTrainResult, EagleTrainResult or GlideTrainResult
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


def search_thirds(prompts: list) -> tuple[list, list, list]:
    """(trained on, not trained on, held back): the search split of ``prompts`` in the
    two thirds heads train on and the third they are measured on, and the held-back
    split, which heads never see."""
    from autotune.prompts import split_prompts

    search, held_back = split_prompts(prompts)
    trained = heads_split(search)
    return trained, [p for p in search if p not in trained], held_back


def answered(target, answer_tokens: int) -> Callable[[list], list]:
    """A filter for ``training_lists``: the prompts whose answers ``answer_tokens`` long
    are in the model's shared set, each second turn kept only where its answer is too
    (a profile trains on what its answers phase decoded, and decodes nothing more)."""
    import dataclasses

    cache = answer_cache(target.fingerprint)

    def keep(prompts: list) -> list:
        known = cache.load([target.encode_chat(p.text) for p in prompts], answer_tokens)
        firsts = [(p, a) for p, a in zip(prompts, known) if a is not None]
        seconds = cache.load(
            [_second_turn(target, p, a) for p, a in firsts if p.followups], answer_tokens
        )
        later = iter(seconds)
        out = []
        for prompt, _ in firsts:
            if prompt.followups and next(later) is None:
                prompt = dataclasses.replace(prompt, followups=())
            out.append(prompt)
        return out

    return keep


def _second_turn(target, prompt, first_answer: list[int]) -> list[int]:
    """The conversation a second turn is answered in, as ``answer_prompts`` builds it."""
    return target.encode_conversation(
        [prompt.text, target.decode(first_answer), prompt.followups[0]]
    )


# Calibration prompts are decoded in chunks of this many, until their time is spent (one
# generation batch: a chunk of 32 took 90 s on 2 cores where 25 s were left).
CALIBRATION_CHUNK = 16


def decode_calibration(
    target,
    prompts_path: Path,
    prompts: list,
    answer_tokens: int,
    seconds: float | None,
    extras: bool = True,
    first_estimate: tuple[float, int] | None = None,
) -> Answered:
    """Fill the model's shared self-distillation set while ``seconds`` last (None: all),
    most needed first: the workload's search split (every method's calibration and the
    heads' report, alternating with what heads train on), the packaged calibration
    prompts (in an order that spreads every prefix over the files' categories), then
    second turns. A chunk is started only when, at the rate measured so far, it ends
    within the time.
    ``first_estimate`` (seconds an answer, least answers): the first chunk, which has no
    measured rate to go by, is cut to what fits at that estimate, never under the least.
    Returns the calibration prompts that were answered: the trainers' extras (none
    when ``extras`` is False: the search split's first turns alone are decoded), and how
    many answers of each origin were decoded (the rest were cached)."""
    from autotune.budget import Budget
    from autotune.training.distill import GENERATION_BATCH, decode_to_cache

    budget = Budget(seconds)
    cache = answer_cache(target.fingerprint)
    pool = calibration_extras(prompts_path) if extras else []
    pool = [pool[i] for i in sorted(range(len(pool)), key=lambda i: (i * 0.6180339887) % 1)]
    trained, reported, _ = search_thirds(prompts)
    # alternating: the first chunk (always decoded) serves both calibration and training
    firsts = [p for pair in itertools.zip_longest(reported, trained) for p in pair if p]
    rate = _process_rate(target.fingerprint)

    decoded = dict.fromkeys(("search prompts", "packaged calibration prompts", "second turns"), 0)

    def decode(ids: list[list[int]], origin: str) -> list[list[int]] | None:
        missing = sum(a is None for a in cache.load(ids, answer_tokens))
        if missing and not rate.fits(missing, budget.left()):
            return None
        with rate.timing(missing):
            got = decode_to_cache(target.model, ids, answer_tokens, GENERATION_BATCH, cache)
        decoded[origin] += missing
        return got

    answers: dict[tuple[str, str], list[int]] = {}  # (id, text): files may share ids
    chunks = [
        ("search prompts", firsts[i : i + GENERATION_BATCH])
        for i in range(0, len(firsts), GENERATION_BATCH)
    ]
    chunks += [
        ("packaged calibration prompts", pool[i : i + CALIBRATION_CHUNK])
        for i in range(0, len(pool), CALIBRATION_CHUNK)
    ]
    taken = 0
    for origin, chunk in chunks:
        left = budget.left()
        if first_estimate is not None and rate.count == 0 and left is not None:
            each, least = first_estimate
            chunk = chunk[: max(least, int(left / max(each, 1e-9)))]
        got = decode([target.encode_chat(p.text) for p in chunk], origin)
        if got is None:
            break
        answers.update(((p.id, p.text), a) for p, a in zip(chunk, got))
        taken += sum(p in pool for p in chunk)
    # second turns last (heads learn from them; no proxy replays them): each needs its
    # first answer in context
    seconds_due = [p for p in firsts + pool[:taken] if p.followups and (p.id, p.text) in answers]
    if not extras:
        seconds_due = []
    for i in range(0, len(seconds_due), CALIBRATION_CHUNK):
        chunk = seconds_due[i : i + CALIBRATION_CHUNK]
        turns = [_second_turn(target, p, answers[p.id, p.text]) for p in chunk]
        if decode(turns, "second turns") is None:
            break
    if taken < len(pool):
        say(f"answers to {taken} of {len(pool)} calibration prompts fitted the time")
    return Answered(pool[:taken], decoded)


@dataclass(frozen=True)
class Answered:
    """What ``decode_calibration`` did: the packaged calibration prompts answered (the
    trainers' extras) and the answers it decoded, by origin."""

    extras: list
    decoded: dict[str, int]

    def text(self) -> str:
        """What the answers phase bought, for the profile's time ledger."""
        parts = [f"{n} {origin}" for origin, n in self.decoded.items() if n]
        return f"answers to {', '.join(parts)}" if parts else "no answer: all were cached"


def _process_rate(fingerprint: str) -> _Rate:
    """The answer rate this process measured for the model: the extra answers phase
    plans its first chunk from the search answers' rate."""
    from autotune.process_cache import cached

    return cached(("answer_rate", fingerprint), _Rate)


class _Rate:
    """Seconds per answer, measured while decoding: whether another chunk fits."""

    def __init__(self) -> None:
        self.seconds, self.count = 0.0, 0

    def fits(self, count: int, left: float | None) -> bool:
        if left is None or self.count == 0:  # the first chunk always runs
            return True
        return count * self.seconds / self.count <= left

    @contextlib.contextmanager
    def timing(self, count: int) -> Iterator[None]:
        start = time.perf_counter()
        yield
        self.seconds += time.perf_counter() - start
        self.count += count


def train_kind(ws, extras: list, answer_tokens: int, kind: str, seconds: float | None) -> Path:
    """Train heads of ``kind`` within ``seconds`` on the workload's prompts and ``extras``
    (their answers ``answer_tokens`` long, from the shared set) and keep them in
    autotune's heads cache (replaced whole: a killed run leaves the old folder or none)."""
    import dataclasses
    import shutil

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
    )
    final = cached_heads_folder(target.fingerprint, kind)
    fresh = final.with_name(f".{kind}-{os.getpid()}")
    shutil.rmtree(fresh, ignore_errors=True)
    resolved = resolve_model(ws.ref.spec, ws.ref.model_path)
    save_heads(trained, kind, options, target, resolved, ws.prompts_path, fresh)
    shutil.rmtree(final, ignore_errors=True)
    fresh.rename(final)
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
) -> TrainedHeads:
    """Train heads of ``kind`` for a loaded target on two thirds of the search split of
    ``prompts`` (the rest is left for `profile` to measure them on) and the calibration
    ``extras``; the target's answers come from the model's shared self-distillation set.
    ``keep``: as ``training_lists`` takes it."""
    search, train_on, reported, followups = training_lists(prompts, extras, keep)
    result = head_kind(kind).train()(
        target,
        [target.encode_chat(p.text) for p in train_on],
        [target.encode_chat(p.text) for p in reported],
        options,
        started,
        followups,
        answer_cache(target.fingerprint),
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
    draft = getattr(result, "draft", None)  # a GLIDE draft: its shape, as trained
    shape = {} if draft is None else {"draft": draft_record(draft)}
    return {
        **shape,
        "trained_by": f"autotune heads train --kind {kind}",
        "method": result.METHOD,
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
            result.LOSS: stats.losses[-1] if stats.losses else None,
        },
        "options": {
            **asdict(options),
            "loss_dtype": str(loss_dtype(options.loss_dtype)).removeprefix("torch."),
        },
        "accuracy_held_back": [asdict(row) for row in result.accuracy],
        "seconds": {k: round(v, 1) for k, v in result.seconds.items()},
    }


def draft_record(draft) -> dict:
    """A GLIDE draft's layers and the target layers whose cache each reads."""
    return {"layers": len(draft.layers), "target_layers": list(draft.target_layers)}
