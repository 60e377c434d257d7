"""The target's own greedy answers to calibration prompts, with the hidden states it
produced them from: what draft heads are trained on (self-distillation)."""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from autotune.cache_entry import CacheEntry
from autotune.engine.runner import Runner
from autotune.progress import say, step

# Greedy answers are decoded this many prompts at a time, by the engine
# (``decode_answers``): on 2 cores 32 answers of 64 tokens took 8.9-9.0 s 16 at a time
# and 8.8 s 32 at a time, so 16; it is also the most lanes a GPU's recorded steps are
# made for (``engine.buckets.LANES``). Their hidden states are computed this many
# sequences to a forward (``teacher_forced``).
GENERATION_BATCH = 16


@dataclass(frozen=True)
class Answer:
    """One greedy answer and the hidden states the target produced it from."""

    tokens: list[int]  # ends at the first end-of-sequence token or at the length limit
    hidden: torch.Tensor  # [len(tokens), H]: row i is the state the base head turned
    #                       into tokens[i] (row 0: the prompt's last position), after the
    #                       final norm
    prefill: torch.Tensor | None = None  # [len(prompt) - 1, H]: the prompt's other
    #                       positions' states, when asked for (EAGLE reads every position)


def greedy_answers(
    model,
    prompts: list[list[int]],
    max_new_tokens: int,
    batch_size: int = GENERATION_BATCH,
    prefill: bool = False,
    runner=None,
) -> list[Answer]:
    """The target's greedy answers to ``prompts`` (token ids, chat template applied) with
    the hidden states it produced them from: the engine decodes the tokens
    (``decode_answers``), then one teacher-forced forward per batch gives their states
    (``teacher_forced``, at prefill speed). ``prefill``: keep the states of every prompt
    position too (``Answer.prefill``). ``runner``: the engine over ``model`` (None: one
    is made for this call)."""
    runner = runner if runner is not None else Runner(model)
    tokens = decode_answers(runner, prompts, max_new_tokens, batch_size)
    return teacher_forced(model, prompts, tokens, batch_size, prefill)


@dataclass(frozen=True)
class AnswerCache:
    """The target's greedy answers kept on disk by model fingerprint, one per prompt (its
    token ids hashed): decoded once, then shared by every head trainer (and later runs),
    which get the hidden states again from one teacher-forced forward per batch, at
    prefill speed."""

    folder: Path
    fingerprint: str

    @property
    def file(self) -> Path:
        return self.folder / f"{self.fingerprint}.json"

    @property
    def entry(self) -> CacheEntry:
        return CacheEntry(self.file, f"the answers of model {self.fingerprint}")

    def _read(self) -> dict:
        """The kept answers by prompt digest; none when there are none, or when the file
        is broken (said, moved aside: the answers are decoded again)."""
        entry = self.entry
        if not entry.usable():
            return {}
        try:
            record = json.loads(self.file.read_text())
            if not isinstance(record, dict):
                raise ValueError("not a JSON object")
        except (OSError, ValueError) as exc:
            entry.discard(f"unreadable: {str(exc).splitlines()[0]}", "decoding them again")
            return {}
        entry.loaded()
        return record

    def load(self, prompts: list[list[int]], max_new_tokens: int) -> list[list[int] | None]:
        """Each prompt's answer cut to ``max_new_tokens`` (a longer greedy answer's prefix
        is the shorter one), or None where none as long is kept."""
        record = self._read()
        found: list[list[int] | None] = []
        for prompt in prompts:
            entry: Any = record.get(_digest(prompt))
            try:
                usable = entry["max_new_tokens"] >= max_new_tokens
                found.append([int(t) for t in entry["tokens"][:max_new_tokens]] if usable else None)
            except (TypeError, KeyError, ValueError):
                found.append(None)
        return found

    def save(self, prompts: list[list[int]], max_new_tokens: int, answers: list[list[int]]) -> None:
        """Each prompt's answer (its tokens) kept."""
        record = self._read()
        for prompt, tokens in zip(prompts, answers):
            record[_digest(prompt)] = {"max_new_tokens": max_new_tokens, "tokens": tokens}
        # whole or not at all: a killed run leaves no half file
        self.entry.write_bytes(json.dumps(record).encode())


def _digest(prompt: list[int]) -> str:
    return hashlib.sha256(json.dumps(prompt).encode()).hexdigest()[:20]


def teacher_forced(
    model,
    prompts: list[list[int]],
    answers: list[list[int]],
    batch_size: int = GENERATION_BATCH,
    prefill: bool = False,
) -> list[Answer]:
    """The hidden states of known answers: one forward over prompt + answer per sequence
    (right-padded: under causal attention the padding changes no earlier position), the
    states the target produced the answers from while decoding them, at prefill speed."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]) + len(answers[i]))
    out: dict[int, Answer] = {}
    with step("hidden states of the answers", len(order)) as advance:
        for start in range(0, len(order), batch_size):
            batch = order[start : start + batch_size]
            seqs = [prompts[i] + answers[i][:-1] for i in batch]
            width = max(map(len, seqs))
            ids = torch.tensor([s + [0] * (width - len(s)) for s in seqs], device=model.device)
            with torch.inference_mode():
                states = model.model(input_ids=ids).last_hidden_state  # after the final norm
            for row, i in enumerate(batch):
                first = len(prompts[i]) - 1  # the prompt's last position made answer[0]
                out[i] = Answer(
                    answers[i],
                    states[row, first : first + len(answers[i])].clone(),
                    states[row, :first].clone() if prefill else None,
                )
                advance()
    return [out[i] for i in range(len(prompts))]


def kept_states(
    model, prompts: list[list[int]], answers: list[list[int]], batch_size: int, prefill: bool
) -> list[Answer]:
    """``teacher_forced``, once per process for the same answers: a head kind's probe and
    its training, and the next kind, read the same states (a forward over every answer:
    25-30 s for SmolLM2-135M on 2 cores). States kept with the prefill serve both."""
    from autotune.process_cache import cached, peek

    digest = hashlib.sha256(json.dumps([prompts, answers]).encode()).hexdigest()

    def key(with_prefill: bool) -> tuple:
        return ("hidden states", id(model), digest, with_prefill)

    def forced() -> tuple:  # the model kept with its states: its id is never reused
        return model, teacher_forced(model, prompts, answers, batch_size, prefill)

    if not prefill and (own := peek(key(False))) is not None:
        return own[1]
    if (wider := peek(key(True))) is not None:
        # without the prompt's states where none were asked for: the caller reads none
        return wider[1] if prefill else [replace(a, prefill=None) for a in wider[1]]
    return cached(key(prefill), forced)[1]


def shared_answers(
    engine: Callable[[], Runner],
    model,
    prompts: list[list[int]],
    max_new_tokens: int,
    batch_size: int,
    prefill: bool,
    cache: AnswerCache | None,
) -> list[Answer]:
    """``greedy_answers``, through ``cache`` when one is given: only the prompts it does
    not hold are decoded (by ``engine()``, made only then), and every answer's states
    come from one teacher-forced forward (``kept_states``)."""
    if cache is None:
        tokens = decode_answers(engine(), prompts, max_new_tokens, batch_size)
    else:
        known = cache.load(prompts, max_new_tokens)
        tokens = [t or [] for t in known]
        if None in known:
            tokens = decode_to_cache(engine(), prompts, max_new_tokens, batch_size, cache)
    return kept_states(model, prompts, tokens, batch_size, prefill)


def decode_answers(
    runner, prompts: list[list[int]], max_new_tokens: int, batch_size: int = GENERATION_BATCH
) -> list[list[int]]:
    """The target's greedy answers to ``prompts``, tokens only, by the engine's batched
    decoding (``batch_size`` sequences in flight, the next prompt admitted as one ends):
    each is the sequence's own plain greedy output, as every method's measurement
    decodes it. Faster than transformers' ``generate`` (``benchmarks/answers.py``); on
    a GPU its steps are the recorded ones, where ``generate`` launches every kernel."""
    from autotune.engine.batched import decode_batch

    with step("greedy answers", len(prompts)) as advance:
        run = decode_batch(runner, prompts, max_new_tokens, batch_size, on_done=advance)
    return [result.tokens for result in run.results]


def decode_to_cache(
    runner,
    prompts: list[list[int]],
    max_new_tokens: int,
    batch_size: int,
    cache: AnswerCache,
    say_reused: bool = False,
    least: int | None = None,
) -> list[list[int]]:
    """The answers' tokens, decoding (and keeping) only those ``cache`` lacks: filling
    the shared set before the trainers read it, without their hidden states (by the
    engine: ``decode_answers``).
    ``say_reused``: say how many were read back (a run that decodes nothing says so).
    ``least``: missing answers are decoded only until that many prompts have one; the
    others come back empty."""
    known = cache.load(prompts, max_new_tokens)
    missing = [i for i, tokens in enumerate(known) if tokens is None]
    if least is not None:
        missing = missing[: max(0, least - (len(prompts) - len(missing)))]
    if say_reused and len(missing) < len(prompts):
        say(
            f"[dim]reusing the model's answers to {len(prompts) - len(missing)} of "
            f"{len(prompts)} prompts, decoded earlier[/dim]"
        )
    if missing:
        asked = [prompts[i] for i in missing]
        decoded = decode_answers(runner, asked, max_new_tokens, batch_size)
        cache.save(asked, max_new_tokens, decoded)
        for i, tokens in zip(missing, decoded):
            known[i] = tokens
    return [tokens or [] for tokens in known]


Pair = tuple[list[int], Answer]  # a prompt's token ids and the target's answer to it


def answer_prompts(
    target,
    search: list[list[int]],
    held_back: list[list[int]],
    max_new_tokens: int,
    batch_size: int,
    followups: list[tuple[str, str]] | None = None,
    prefill: bool = False,
    cache: AnswerCache | None = None,
    runner: Runner | None = None,
) -> tuple[list[Pair], list[Pair]]:
    """The target's answers: (prompt, answer) pairs to train on, and held-back ones.

    ``followups`` (first turn, second turn), one per search prompt with a second turn (in
    order, first), add a second round of answers to train on: the conversation so far is
    its prompt. ``prefill``: keep the states of every prompt position (EAGLE). ``cache``:
    answers decoded before (by another trainer, or run) are read back, not decoded.
    ``runner``: the engine that decodes the others (None: one is made if any is needed)."""
    model = target.model
    engine = functools.cache(lambda: runner if runner is not None else Runner(model))
    # one pool: the engine admits the next prompt as one ends, whichever split it is in
    answers = shared_answers(
        engine, model, search + held_back, max_new_tokens, batch_size, prefill, cache
    )
    train = list(zip(search, answers[: len(search)]))
    if followups:
        conversations = [
            target.encode_conversation([first, target.decode(answer.tokens), second])
            for (first, second), (_, answer) in zip(followups, train)
        ]
        train += zip(
            conversations,
            shared_answers(
                engine, model, conversations, max_new_tokens, batch_size, prefill, cache
            ),
        )
    return train, list(zip(held_back, answers[len(search) :]))
