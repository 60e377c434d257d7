"""One self-distillation job for every head kind: the target answers the prompts, the
kind trains on the search prompts' answers (``training.loop.train_loop``), its accuracy
is reported on the held-back prompts' answers, and one result type says what happened.

A kind supplies only what differs (``HeadTrainer``'s steps): the examples it builds from
the answers, what it trains on them, how it measures and saves that; the answers, the
time budget, the phases' seconds and the result are shared."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch

from autotune.training.distill import AnswerCache, Pair, answer_prompts
from autotune.training.loop import TrainStats, training_time


@dataclass(frozen=True)
class AnswerSplit:
    """The target's answers: (prompt, answer) pairs to train on and held-back ones."""

    train: list[Pair]
    held_back: list[Pair]

    @property
    def train_tokens(self) -> int:
        return sum(len(answer.tokens) for _, answer in self.train)

    @property
    def held_back_tokens(self) -> int:
        return sum(len(answer.tokens) for _, answer in self.held_back)

    def token_counts(self) -> dict[int, int]:
        """How often the target emitted each token in the training answers: the ranked
        list draft vocabularies are cut from (``heads.eagle.DraftProjection``)."""
        return dict(Counter(token for _, answer in self.train for token in answer.tokens))


def phase_seconds(
    started: float, began: float, generated: float, trained: float, done: float
) -> dict[str, float]:
    """A training job's seconds by phase (perf_counter marks), as a heads folder records
    them: ``started`` when the job began (its budget counts from there), ``began`` when
    the trainer did."""
    return {
        "generation": generated - began,
        "training": trained - generated,
        "report": done - trained,
        "total": done - started,
    }


class HeadTrainer(ABC):
    """What one head kind trains, and how: ``train`` is the job every kind runs; the
    other methods are the kind's own steps in it."""

    METHOD: ClassVar[str]  # how the heads were made, as their folder's record says
    LOSS: ClassVar[str]  # the record's name for what ``TrainStats.losses`` hold

    def view(self, target, runner=None) -> Any:
        """The target as the kind's steps take it (``view``): its model; GLIDE's, a runner
        over it (``runner`` where one is given: it reads the target's KV cache)."""
        return target.model

    def prefill(self, options) -> bool:
        """Whether the answers keep the states of every prompt position."""
        return False

    @abstractmethod
    def examples(self, view, answers: AnswerSplit, options) -> tuple[Any, Any]:
        """What the kind trains on and what it reports on, built from the answers."""

    @abstractmethod
    def fit(
        self, view, examples, options, seconds: float | None
    ) -> tuple[torch.nn.Module, TrainStats]:
        """A new module of the kind, trained on ``examples`` for at most ``seconds``."""

    @abstractmethod
    def accuracy(self, trained, view, examples, options) -> list:
        """Held-back accuracy: one score per head, draft depth or step."""

    @abstractmethod
    def save(self, result: TrainResult, folder: Path, target, base_model: str, extra: dict):
        """Write the trained module to ``folder``, with ``extra`` in its config; returns
        the folder."""

    def level_seconds(self, result: TrainResult, runner) -> float:
        """Seconds of one drafting level, one token wide, of what was trained: the cost a
        bound charges for drafting. 0 (drafting free) where a kind does not measure it."""
        return 0.0

    def shape_record(self, trained) -> dict:
        """What the folder's record says of the trained module's shape (none by default)."""
        return {}

    def train(
        self,
        target,
        search: list[list[int]],
        held_back: list[list[int]],
        options,
        started: float | None = None,
        followups: list[tuple[str, str]] | None = None,
        answers: AnswerCache | None = None,
        runner=None,
    ) -> TrainResult:
        """Generate answers, train on the search prompts' answers, report accuracy on the
        held-back prompts' answers. ``started`` (perf_counter) is when the job began: the
        time budget counts from there. ``followups`` (first turn, second turn), one per
        search prompt with a second turn, add a second round of answers to train on: the
        data, not the epochs, limits the heads. ``answers``: answers decoded before are
        read back from it, not decoded; ``runner``: the engine that decodes the others
        (None: one is made where any is needed)."""
        began = time.perf_counter()
        started = began if started is None else started
        view = self.view(target, runner)
        torch.manual_seed(options.seed)
        split = AnswerSplit(
            *answer_prompts(
                target,
                search,
                held_back,
                options.max_new_tokens,
                options.generation_batch,
                followups,
                prefill=self.prefill(options),
                cache=answers,
                runner=runner,
            )
        )
        train, held = self.examples(view, split, options)
        generated = time.perf_counter()
        seconds = training_time(options.time_budget_s, started, generated)
        trained, stats = self.fit(view, train, options, seconds)
        fitted = time.perf_counter()
        accuracy = self.accuracy(trained, view, held, options)
        done = time.perf_counter()
        return TrainResult(
            self,
            trained,
            accuracy=accuracy,
            stats=stats,
            train_tokens=split.train_tokens,
            held_back_tokens=split.held_back_tokens,
            seconds=phase_seconds(started, began, generated, fitted, done),
            token_counts=split.token_counts(),
        )


@dataclass
class TrainResult:
    """What a trainer made and reports, whatever its kind: the trained module (Medusa
    heads, an EAGLE head or a GLIDE draft), held-back accuracy, the loop's figures, the
    answer tokens it trained and reported on, its seconds by phase (``phase_seconds``)
    and the training answers' token counts."""

    trainer: HeadTrainer
    trained: Any  # MedusaHeads, EagleHead or GlideDraft
    accuracy: list  # one score per head (Medusa), draft depth (EAGLE) or step (GLIDE)
    stats: TrainStats
    train_tokens: int
    held_back_tokens: int
    seconds: dict[str, float]
    token_counts: dict[int, int] = field(default_factory=dict)

    def save(self, folder: Path, target, base_model: str, extra: dict) -> Path:
        return self.trainer.save(self, folder, target, base_model, extra)

    def level_seconds(self, runner) -> float:
        return self.trainer.level_seconds(self, runner)
