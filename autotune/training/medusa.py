"""Train Medusa-1 heads on a frozen target by self-distillation.

The data are the target's own greedy answers to calibration prompts, so the heads learn
what the target will say. The features are its last hidden state after the final norm,
the tensor a Medusa drafter reads at inference. Head k reading the hidden state at
position t learns the token at t + k + 2 (the base lm_head predicts t + 1).

Only the heads' residual blocks are trained. Every head's vocabulary projection is the
target's frozen lm_head, shared (``MedusaHeads.share_vocab_projection``): on CPU all heads
then cost one matrix product with one weight at inference, instead of one vocabulary-
sized weight each, and training never updates a vocabulary-sized matrix.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch

from autotune.errors import AutotuneError
from autotune.heads.medusa import MedusaHeads, save_medusa_heads
from autotune.training.distill import GENERATION_BATCH, Answer
from autotune.training.loop import TrainStats, train_loop
from autotune.training.loss import (
    IGNORE,
    FrozenProjectionCE,
    TrainingVocab,
    greedy_next,
    loss_dtype,
)
from autotune.training.trainer import AnswerSplit, HeadTrainer, TrainResult

# Positions per chunk when measuring accuracy (all heads' logits at once, float32).
EVAL_CHUNK_POSITIONS = 96


@dataclass(frozen=True)
class MedusaOptions:
    num_heads: int = 5
    num_layers: int = 1
    max_new_tokens: int = 256  # answer length (tokens) per calibration prompt
    # Measured on SmolLM2-135M (60 MT-bench answers, held-back top-1 of head 0): 3 epochs
    # 0.195, 6 epochs 0.217, 10 epochs 0.216; more answers helped more (30 prompts: 0.153).
    epochs: int = 6
    # Seconds for answer generation and training together (the held-back report comes
    # after, ~1/4 of an epoch's time); training ends early to keep it. None: all epochs.
    time_budget_s: float | None = 780.0
    positions_per_step: int = 256  # hidden states per minibatch (each feeds every head)
    # Medusa-1 used 1e-3 over many thousand steps; in the few hundred here 3e-3 did better
    lr: float = 3e-3
    weight_decay: float = 0.0
    # Dtype of the vocabulary product while training (accuracy is always measured in
    # float32); see ``loss_dtype``.
    loss_dtype: str = "auto"
    # Tokens the loss ranks among (``training.loss.TrainingVocab``); 0: the whole vocabulary.
    train_vocab: int = 8192
    # Train on the prompts' positions too, labelled with the target's greedy next tokens.
    # SmolLM2-135M, 38 answers of 128 tokens, a 120 s job, held-back top-1 of heads 1..5:
    # answers alone over the whole vocabulary (1.6 epochs) .077 .019 .029 .028 .021; with
    # the prompts' positions and ``train_vocab`` 8192 (6 epochs) .115 .026 .026 .028 .016.
    prompt_positions: bool = True
    generation_batch: int = GENERATION_BATCH
    seed: int = 0


@dataclass(frozen=True)
class HeadData:
    """Training or test pairs: each hidden state with the token every head should give."""

    features: torch.Tensor  # [N, H] float32
    labels: torch.Tensor  # [N, K] int64; labels[:, k] = token k + 2 ahead, or IGNORE
    tokens: int  # answer tokens these came from

    @classmethod
    def from_answers(
        cls, answers: list[Answer], num_heads: int, lm_head: torch.Tensor | None = None
    ) -> HeadData:
        """The answers' positions; with ``lm_head`` (the target's weight) the prompts'
        positions too, where the labels are the target's greedy next tokens after the text
        (the answers need ``prefill`` states): far more positions from the same forwards."""
        features, labels = [], []
        for answer in answers:
            states, written = answer.hidden, torch.tensor(answer.tokens)
            if lm_head is not None and answer.prefill is not None:
                states = torch.cat([answer.prefill, states])
                written = torch.cat([greedy_next(answer.prefill, lm_head), written])
            count = len(written) - 1  # the last state's next tokens are not known
            if count < 1:
                continue
            # row i: head k predicts written[i + k + 1] (the base head predicts written[i])
            padded = torch.cat([written, torch.full((num_heads,), IGNORE)])
            index = torch.arange(count)[:, None] + torch.arange(1, num_heads + 1)[None, :]
            features.append(states[:count])
            labels.append(padded[index])
        if not features:
            raise AutotuneError(
                "the target's answers are too short to train heads on "
                "(every answer ended after one token): use other prompts"
            )
        return cls(
            torch.cat(features).float().clone(),
            torch.cat(labels),
            sum(len(a.tokens) for a in answers),
        )

    @property
    def num_heads(self) -> int:
        return self.labels.shape[1]

    def positions(self) -> list[int]:
        """Pairs with a label, per head: head k has fewer than head 0."""
        return (self.labels != IGNORE).sum(0).tolist()


def heads_loss(feats: torch.Tensor, labels: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Sum over heads of each head's mean cross-entropy.

    feats: [K, B, H] the heads' inputs to the projection; labels: [B, K] (IGNORE allowed);
    weight: [V, H] the shared projection, in the dtype the product should run in. All
    heads' rows go through one matrix product with the one weight."""
    targets = labels.T  # [K, B]
    valid = targets != IGNORE
    counts = valid.sum(1).clamp(min=1)  # [K]
    row_weights = (1.0 / counts.float())[:, None].expand_as(targets)[valid]
    return FrozenProjectionCE.apply(feats[valid], weight, targets[valid], row_weights)


def train_heads(
    heads: MedusaHeads, data: HeadData, options: MedusaOptions, seconds: float | None = None
) -> TrainStats:
    """AdamW on the residual blocks, minibatches of positions (see ``train_loop``)."""
    if not heads.shares_vocab_projection:
        raise ValueError(
            "train_heads needs heads sharing the frozen lm_head (call share_vocab_projection first)"
        )
    lm_head = heads.vocab_weights()[0].detach()
    vocab = TrainingVocab.of(data.labels, lm_head.shape[0], options.train_vocab)
    weight = vocab.weight(lm_head).to(loss_dtype(options.loss_dtype))
    labels = vocab.map(data.labels)
    blocks = [p for k in range(heads.num_heads) for p in heads.blocks(k).parameters()]

    def loss_of(batch: torch.Tensor) -> torch.Tensor:
        return heads_loss(heads.features(data.features[batch]), labels[batch], weight)

    heads.train()
    try:
        return train_loop(
            blocks, options, data.features.shape[0], options.positions_per_step, seconds, loss_of
        )
    finally:
        heads.eval()


@dataclass(frozen=True)
class HeadScore:
    """One head's accuracy on held-back answers."""

    UNIT: ClassVar[str] = "head"  # what the first column of ``accuracy_table`` counts

    head: int
    offset: int  # tokens ahead of the hidden state it reads (k + 2)
    top1: float
    top5: float
    positions: int  # pairs it was measured on


@torch.inference_mode()
def head_accuracy(heads: MedusaHeads, data: HeadData) -> list[HeadScore]:
    """Top-1 / top-5 accuracy of every head, each over its own valid positions (float32)."""
    num_heads = min(heads.num_heads, data.num_heads)
    hits1 = torch.zeros(num_heads, dtype=torch.long)
    hits5 = torch.zeros(num_heads, dtype=torch.long)
    for start in range(0, data.features.shape[0], EVAL_CHUNK_POSITIONS):
        part = slice(start, start + EVAL_CHUNK_POSITIONS)
        logits = heads(data.features[part], num_heads)  # [K, c, V]
        top = logits.topk(5, dim=-1).indices  # [K, c, 5]
        target = data.labels[part, :num_heads].T[..., None]  # [K, c, 1]
        hits1 += (top[..., :1] == target).any(-1).sum(-1)
        hits5 += (top == target).any(-1).sum(-1)
    positions = data.positions()[:num_heads]
    return [
        HeadScore(k, k + 2, hits1[k].item() / max(n, 1), hits5[k].item() / max(n, 1), n)
        for k, n in enumerate(positions)
    ]


class MedusaTrainer(HeadTrainer):
    """Medusa heads: residual blocks over the target's last hidden state, each head
    reading it through the target's frozen lm_head (``train_heads``)."""

    METHOD = "Medusa-1 self-distillation: frozen target, frozen shared lm_head"
    LOSS = "final_loss_sum_over_heads"  # what stats.losses hold

    def prefill(self, options: MedusaOptions) -> bool:
        return options.prompt_positions

    def examples(
        self, view, answers: AnswerSplit, options: MedusaOptions
    ) -> tuple[HeadData, HeadData]:
        lm_head = view.lm_head.weight if options.prompt_positions else None
        train = HeadData.from_answers([a for _, a in answers.train], options.num_heads, lm_head)
        held = HeadData.from_answers([a for _, a in answers.held_back], options.num_heads)
        return train, held

    def fit(
        self, view, examples: HeadData, options: MedusaOptions, seconds: float | None
    ) -> tuple[MedusaHeads, TrainStats]:
        config = view.config
        heads = MedusaHeads(
            config.hidden_size, config.vocab_size, options.num_heads, options.num_layers
        )
        # Train only the residual blocks: the projection stays the frozen base lm_head,
        # shared by every head, so at inference all heads cost one product with one
        # weight on CPU.
        heads.share_vocab_projection(view.lm_head.weight)
        return heads, train_heads(heads, examples, options, seconds)

    def accuracy(self, trained: MedusaHeads, view, examples: HeadData, options) -> list:
        return head_accuracy(trained, examples)

    def save(self, result: TrainResult, folder: Path, target, base_model: str, extra: dict):
        return save_medusa_heads(result.trained, folder, base_model=base_model, extra=extra)

    def level_seconds(self, result: TrainResult, runner) -> float:
        """The first head and the shared lm_head over one hidden state."""
        from autotune.measure.head_accuracy import measure_head_costs

        return measure_head_costs(runner, result.trained, repeats=9)[0]


# Generate answers, train heads on the search prompts' answers, report accuracy on the
# held-back prompts' answers (``HeadTrainer.train``).
train_medusa = MedusaTrainer().train
