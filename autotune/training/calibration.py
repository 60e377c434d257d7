"""The model's shared self-distillation answers: which prompts heads train on and are
measured on (the thirds of the search split), the packaged calibration prompts that join
them, decoding their answers while a time lasts, and which of them are answered."""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.budget import Budget
from autotune.progress import say


def heads_split(search: list) -> list:
    """The part of the search split heads are trained on (two thirds, by category)."""
    from autotune.prompts import split_prompts

    if len(search) < 3:
        return search
    return split_prompts(search, held_back_fraction=1 / 3, seed=1)[0]


def answer_cache(model_fingerprint: str):
    """The shared self-distillation set of a model (``training.distill.AnswerCache``)."""
    from autotune.paths import cache_root
    from autotune.training.distill import AnswerCache

    return AnswerCache(cache_root() / "answers", model_fingerprint)


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
    runner,
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
    decoder = _ChunkDecoder(target, runner, answer_tokens, Budget(seconds))
    pool = calibration_extras(prompts_path) if extras else []
    pool = [pool[i] for i in sorted(range(len(pool)), key=lambda i: (i * 0.6180339887) % 1)]
    trained, reported, _ = search_thirds(prompts)
    # alternating: the first chunk (always decoded) serves both calibration and training
    firsts = [p for pair in itertools.zip_longest(reported, trained) for p in pair if p]
    answers, taken = _decode_first_turns(decoder, firsts, pool, first_estimate)
    # second turns last (heads learn from them; no proxy replays them): each needs its
    # first answer in context
    if extras:
        due = [p for p in firsts + pool[:taken] if p.followups and (p.id, p.text) in answers]
        _decode_second_turns(decoder, due, answers)
    if taken < len(pool):
        say(f"answers to {taken} of {len(pool)} calibration prompts fitted the time")
    return Answered(pool[:taken], decoder.decoded)


@dataclass
class _ChunkDecoder:
    """Decodes chunks of answers into the model's shared set while its budget lasts, and
    counts what it decoded, by origin."""

    target: Any
    runner: Any  # the engine that decodes the answers (``distill.decode_answers``)
    answer_tokens: int
    budget: Budget
    decoded: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(
            ("search prompts", "packaged calibration prompts", "second turns"), 0
        )
    )

    def __post_init__(self) -> None:
        self.cache = answer_cache(self.target.fingerprint)
        self.rate = _process_rate(self.target.fingerprint)

    def decode(self, ids: list[list[int]], origin: str) -> list[list[int]] | None:
        """The answers to ``ids`` (those not cached decoded now), or None when decoding
        them would not end within the budget at the rate measured so far."""
        from autotune.training.distill import GENERATION_BATCH, decode_to_cache

        missing = sum(a is None for a in self.cache.load(ids, self.answer_tokens))
        if missing and not self.rate.fits(missing, self.budget.left()):
            return None
        with self.rate.timing(missing):
            got = decode_to_cache(
                self.runner, ids, self.answer_tokens, GENERATION_BATCH, self.cache
            )
        self.decoded[origin] += missing
        return got


def _decode_first_turns(
    decoder: _ChunkDecoder, firsts: list, pool: list, first_estimate: tuple[float, int] | None
) -> tuple[dict[tuple[str, str], list[int]], int]:
    """The answers to the search prompts ``firsts``, then to the calibration ``pool``, in
    chunks while they fit, by (id, text) (files may share ids); and how many of the
    pool's prompts were answered."""
    from autotune.training.distill import GENERATION_BATCH

    chunks = [
        ("search prompts", firsts[i : i + GENERATION_BATCH])
        for i in range(0, len(firsts), GENERATION_BATCH)
    ]
    chunks += [
        ("packaged calibration prompts", pool[i : i + CALIBRATION_CHUNK])
        for i in range(0, len(pool), CALIBRATION_CHUNK)
    ]
    answers: dict[tuple[str, str], list[int]] = {}
    taken = 0
    for origin, chunk in chunks:
        left = decoder.budget.left()
        if first_estimate is not None and decoder.rate.count == 0 and left is not None:
            each, least = first_estimate
            chunk = chunk[: max(least, int(left / max(each, 1e-9)))]
        got = decoder.decode([decoder.target.encode_chat(p.text) for p in chunk], origin)
        if got is None:
            break
        answers.update(((p.id, p.text), a) for p, a in zip(chunk, got))
        taken += sum(p in pool for p in chunk)
    return answers, taken


def _decode_second_turns(
    decoder: _ChunkDecoder, due: list, answers: dict[tuple[str, str], list[int]]
) -> None:
    """The second turns of the prompts ``due``, in chunks while they fit: each in the
    conversation of its first turn and that turn's answer."""
    target = decoder.target
    for i in range(0, len(due), CALIBRATION_CHUNK):
        chunk = due[i : i + CALIBRATION_CHUNK]
        turns = [_second_turn(target, p, answers[p.id, p.text]) for p in chunk]
        if decoder.decode(turns, "second turns") is None:
            break


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
