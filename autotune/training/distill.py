"""The target's own greedy answers to calibration prompts, with the hidden states it
produced them from: what draft heads are trained on (self-distillation)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from autotune.cache_entry import CacheEntry
from autotune.engine.runner import eos_ids
from autotune.errors import AutotuneError
from autotune.progress import say, step

# Greedy answers are generated this many prompts at a time. By transformers' generate
# (left-padded, prompts of similar length together): on 2 cores SmolLM2-135M took ~12 ms
# per token at batch 8 and ~7 ms at 16; at 32 the padded prefill grew faster than the
# per-token cost fell. By the engine (``decode_answers``, no padding): 32 answers of 64
# tokens took 8.9-9.0 s 16 at a time and 8.8 s 32 at a time, so 16 stays; it is also the
# most lanes a GPU's recorded steps are made for (``engine.buckets.LANES``).
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


@contextlib.contextmanager
def _capture_final_norm(
    model,
    store: list[torch.Tensor],
    on_forward: Callable[[], None] | None,
    prefill: list[torch.Tensor] | None = None,
) -> Iterator[None]:
    """While active, each forward appends the last position's output of the final norm;
    with ``prefill``, the first forward's whole output [B, P, H] is kept there too."""
    norm = getattr(getattr(model, "model", None), "norm", None)
    if norm is None:
        raise AutotuneError(
            f"{type(model).__name__} has no model.norm: heads are trained "
            "on LLaMA-family models only"
        )

    def keep(module, args, output):
        if prefill is not None and not store:
            prefill.append(output.clone())
        # [B, H]: the prompt's last position (prefill), then each new token's
        store.append(output[:, -1].clone())
        if on_forward is not None:
            on_forward()

    handle = norm.register_forward_hook(keep)
    try:
        yield
    finally:
        handle.remove()


def _trim(tokens: list[int], eos: set[int]) -> list[int]:
    for i, token in enumerate(tokens):
        if token in eos:
            return tokens[: i + 1]
    return tokens


def _generate_batch(
    model,
    prompts: list[list[int]],
    max_new_tokens: int,
    pad: int,
    eos: set[int],
    on_forward,
    with_prefill: bool,
) -> list[Answer]:
    from transformers import GenerationConfig

    width = max(map(len, prompts))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=model.device)
    mask = torch.tensor(
        [[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=model.device
    )
    config = GenerationConfig(
        do_sample=False,
        max_new_tokens=max_new_tokens,
        pad_token_id=pad,
        eos_token_id=sorted(eos) or None,
    )
    store: list[torch.Tensor] = []
    prefill: list[torch.Tensor] | None = [] if with_prefill else None
    with _capture_final_norm(model, store, on_forward, prefill), torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    hidden = torch.stack(store, dim=1)  # [B, steps, H]
    answers = []
    for row, prompt in enumerate(prompts):
        tokens = _trim(out[row, width:].tolist(), eos)
        # the prompt's positions but its last (that one is hidden[row, 0]), padding left out
        before = prefill[0][row, width - len(prompt) : width - 1] if prefill else None
        answers.append(Answer(tokens, hidden[row, : len(tokens)], before))
    return answers


class _Counter:
    """Counts calls, advancing a progress bar with each."""

    def __init__(self, advance: Callable[..., None]):
        self.advance, self.count = advance, 0

    def __call__(self) -> None:
        self.count += 1
        self.advance()


def generate_answers(
    model,
    prompts: list[list[int]],
    max_new_tokens: int,
    batch_size: int = GENERATION_BATCH,
    prefill: bool = False,
) -> list[Answer]:
    """The target's greedy answers to ``prompts`` (token ids, chat template applied) and
    their hidden states, captured from the same forwards: no second pass over the text.
    ``prefill``: keep the states of every prompt position too (``Answer.prefill``).
    Batches hold prompts of similar length; answers come back in the order of prompts."""
    eos = set(eos_ids(model))
    pad = getattr(model.generation_config, "pad_token_id", None)
    pad = pad if pad is not None else (min(eos) if eos else 0)  # masked out: any id will do
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    count = math.ceil(len(order) / batch_size)  # batches of near-equal size
    batches = [order[len(order) * b // count : len(order) * (b + 1) // count] for b in range(count)]
    answers: dict[int, Answer] = {}
    with step("greedy answers + hidden states", len(batches) * max_new_tokens) as advance:
        for batch in batches:
            forwards = _Counter(advance)
            got = _generate_batch(
                model, [prompts[i] for i in batch], max_new_tokens, pad, eos, forwards, prefill
            )
            advance(max_new_tokens - forwards.count)  # the batch stopped early: all rows ended
            answers.update(zip(batch, got))
    return [answers[i] for i in range(len(prompts))]


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
    states ``generate_answers`` would have captured while decoding them."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]) + len(answers[i]))
    out: dict[int, Answer] = {}
    with step("hidden states of cached answers", len(order)) as advance:
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
    model,
    prompts: list[list[int]],
    max_new_tokens: int,
    batch_size: int,
    prefill: bool,
    cache: AnswerCache | None,
) -> list[Answer]:
    """``generate_answers``, through ``cache`` when one is given: only the prompts it
    does not hold are decoded."""
    known = cache.load(prompts, max_new_tokens) if cache is not None else [None] * len(prompts)
    missing = [i for i, tokens in enumerate(known) if tokens is None]
    kept = [i for i, tokens in enumerate(known) if tokens is not None]
    answers: dict[int, Answer] = {}
    if missing:
        decoded = generate_answers(
            model, [prompts[i] for i in missing], max_new_tokens, batch_size, prefill
        )
        answers.update(zip(missing, decoded))
        if cache is not None:
            cache.save([prompts[i] for i in missing], max_new_tokens, [a.tokens for a in decoded])
    if kept:
        forced = kept_states(
            model, [prompts[i] for i in kept], [known[i] or [] for i in kept], batch_size, prefill
        )
        answers.update(zip(kept, forced))
    return [answers[i] for i in range(len(prompts))]


def decode_answers(
    runner, prompts: list[list[int]], max_new_tokens: int, batch_size: int = GENERATION_BATCH
) -> list[list[int]]:
    """The target's greedy answers to ``prompts``, tokens only, by the engine's batched
    decoding (``batch_size`` sequences in flight, the next prompt admitted as one ends):
    each is the sequence's own plain greedy output, as every method's measurement
    decodes it. Where no hidden state is kept, this is faster than transformers'
    ``generate`` (``benchmarks/answers.py``); on a GPU its steps are the recorded ones,
    where ``generate`` launches every kernel."""
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
) -> tuple[list[Pair], list[Pair]]:
    """The target's answers: (prompt, answer) pairs to train on, and held-back ones.

    ``followups`` (first turn, second turn), one per search prompt with a second turn (in
    order, first), add a second round of answers to train on: the conversation so far is
    its prompt. ``prefill``: keep the states of every prompt position (EAGLE). ``cache``:
    answers decoded before (by another trainer, or run) are read back, not decoded."""
    model = target.model
    # one pool: batches of similar-length prompts, whichever split they belong to
    answers = shared_answers(model, search + held_back, max_new_tokens, batch_size, prefill, cache)
    train = list(zip(search, answers[: len(search)]))
    if followups:
        conversations = [
            target.encode_conversation([first, target.decode(answer.tokens), second])
            for (first, second), (_, answer) in zip(followups, train)
        ]
        train += zip(
            conversations,
            shared_answers(model, conversations, max_new_tokens, batch_size, prefill, cache),
        )
    return train, list(zip(held_back, answers[len(search) :]))
