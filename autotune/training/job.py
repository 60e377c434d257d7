"""`autotune heads train`: check the inputs, load the target, train heads of one kind,
write the heads folder with a record of how they were made."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from autotune.errors import AutotuneError, OutputPathError
from autotune.progress import say
from autotune.training.loss import loss_dtype

KINDS = ("medusa", "eagle")


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
    if kind not in KINDS:
        raise AutotuneError(f"unknown head kind '{kind}': choose from {', '.join(KINDS)}")


def default_options(kind: str):
    """The options a head kind trains with unless told otherwise."""
    check_kind(kind)
    if kind == "eagle":
        from autotune.training.eagle import EagleOptions

        return EagleOptions()
    from autotune.training.medusa import MedusaOptions

    return MedusaOptions()


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


def default_out(model_name: str, kind: str = "medusa") -> Path:
    return Path("heads") / f"{model_name}-{kind}"


@dataclass(frozen=True)
class HeadsJob:
    """What ``autotune heads train`` was asked to do."""

    kind: str
    model: str
    model_path: str | None = None
    prompts: str | None = None
    out: Path | None = None
    options: Any = None  # MedusaOptions or EagleOptions, by kind; None: the defaults
    dtype: str = "float32"
    device: str = "cpu"


def run_heads_train(job: HeadsJob):
    """Check every input (cheap), then load the target, train, save the heads folder.
    Medusa heads or an EAGLE head, as ``job.kind`` says (the result has the same fields)."""
    from autotune.models import ALIASES, load_target, resolve_model
    from autotune.prompts import default_prompts_path, load_prompts, split_prompts

    started = time.perf_counter()
    defaults = default_options(job.kind)
    options = defaults if job.options is None else job.options
    if type(options) is not type(defaults):
        raise ValueError(
            f"{job.kind} heads take {type(defaults).__name__}, not {type(options).__name__}"
        )
    prompts_path = Path(job.prompts).expanduser() if job.prompts else default_prompts_path()
    prompts = load_prompts(prompts_path)
    search, held_back = split_prompts(prompts)
    # A third of the search split is left to `autotune profile`, which must measure the
    # heads (accuracy, trees) on answers they were not trained on; the held-back split
    # stays unseen by both, for the final figures.
    search = heads_split(search)
    if not held_back:
        raise AutotuneError(
            f"{prompts_path} has one prompt: heads need at least two "
            "(one to train on, one held back to measure them)"
        )
    loss_dtype(options.loss_dtype)
    resolved = resolve_model(job.model, job.model_path)
    out = job.out or default_out(resolved.name, job.kind)
    check_out_folder(out)
    say(f"loading {resolved.name} from {resolved.path}")
    target = load_target(job.model, job.model_path, job.dtype, job.device)
    # second turns follow their first: answers to them need the first answers in context
    search = sorted(search, key=lambda p: not p.followups)
    followups = [(p.text, p.followups[0]) for p in search if p.followups]
    train: Callable[..., Any]
    if job.kind == "eagle":
        from autotune.training.eagle import train_eagle as train
    else:
        from autotune.training.medusa import train_medusa as train
    result = train(
        target,
        [target.encode_chat(p.text) for p in search],
        [target.encode_chat(p.text) for p in held_back],
        options,
        started,
        followups,
    )
    # upstream configs name the Hugging Face repo; a local model is named by its path
    base = resolved.source if resolved.source in ALIASES.values() else str(resolved.path)
    record = _record(
        job.kind,
        options,
        target,
        prompts_path,
        (len(search), len(held_back)),
        result,
        [p.id for p in search],
    )
    result.save(out, target, base, {"autotune": record})
    return result, out


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
    return {
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
