"""Train an EAGLE-1/2 draft head on a frozen target by self-distillation.

The data are the target's own greedy answers to calibration prompts (as for Medusa heads,
``training.medusa``), with its normed last hidden state f_t at EVERY position, prompt
included: the head attends over the whole sequence as it does when drafting.

At position t the head reads the pair (f_t, embedding of x_{t+1}). Its output there is
trained to equal f_{t+1} (feature regression, SmoothL1 as in EAGLE) and, through the
target's frozen lm_head, to give x_{t+2} (cross-entropy). In the prompt, text the target
did not write, the token label is instead what the target would write next there (its
greedy next token): the prompt's rows add training data at no extra forward. Noise on the input
features, and an unrolled second step that reads the head's own first-step output (as
drafting does from depth 2 on), teach it to cope with its own errors.

Only fc and the decoder layer are trained; the embedding and lm_head stay the target's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from autotune.errors import AutotuneError
from autotune.heads.eagle import EagleHead, head_config, save_draft_vocab, save_eagle_head
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

INITS = ("random", "identity", "last-layer")


@dataclass(frozen=True)
class EagleOptions:
    # Choices measured on SmolLM2-135M (80 answers to train on, 20 held back; 180 s of
    # training each; held-back top-1 at draft depths 1..5):
    #   init identity, unroll 1      .279 .088 .060 .047 .033
    #   init random,   unroll 1      .245 .104 .085 .089 .077
    #   init identity, unroll 2      .198 .115 .087 .057 .040   (4 epochs, not 10)
    #   init random,   unroll 2      .188 .171 .147 .142 .138   (3.6 epochs, not 10)
    #   identity + token_weight 1.0  .273 .072 .040 .038 .025
    #   identity + lr 3e-3           .153 .033 .029 .022 .012
    #   identity + last-layer init   .026 .000 .000 .000 .000   (its residual scale is
    #                                the target's pre-norm one, not the features')
    # The unrolled step trades some depth-1 accuracy for much better deeper drafts, which
    # is what a draft tree lives on.
    max_new_tokens: int = 256  # answer length (tokens) per calibration prompt
    epochs: int = 40  # an upper bound: the time budget ends training first
    # Seconds for answer generation and training together (the held-back report and
    # saving come after, 15-60 s on SmolLM2-135M); training ends early to keep it.
    time_budget_s: float | None = 870.0
    sequences_per_step: int = 2  # prompt + answer sequences per minibatch
    lr: float = 1e-3
    weight_decay: float = 0.0
    feature_weight: float = 1.0  # EAGLE-1's weights: SmoothL1 on features 1.0,
    token_weight: float = 0.1  # cross-entropy of the next-next token 0.1
    noise: float = 0.1  # std of the input features' noise, in features' RMS
    unroll: int = 2  # steps trained per position (2: also from its own output)
    init: str = "random"  # see ``new_head``
    depth: int = 5  # draft depths in the held-back report
    loss_dtype: str = "auto"  # of the vocabulary product; see ``training.loss.loss_dtype``
    # Tokens the loss ranks among (``training.loss.TrainingVocab``); 0: the whole vocabulary.
    train_vocab: int = 8192
    # Train on the prompts' rows too, labelled with the target's greedy next tokens.
    # SmolLM2-135M, 38 answers of 128 tokens, a 120 s job, held-back top-1 at depths 1..5:
    # answers' rows over the whole vocabulary (4.3 epochs) .116 .105 .099 .097 .098; with
    # the prompts' rows and ``train_vocab`` 8192 (8.1 epochs) .131 .132 .103 .102 .101.
    prompt_positions: bool = True
    generation_batch: int = GENERATION_BATCH
    seed: int = 0

    def __post_init__(self):
        if self.init not in INITS:
            raise AutotuneError(f"unknown EAGLE head init '{self.init}': use {', '.join(INITS)}")
        if self.unroll < 1 or self.depth < 1 or self.sequences_per_step < 1:
            raise AutotuneError("unroll, depth and sequences_per_step must be at least 1")


# --- data ----------------------------------------------------------------------------


@dataclass(frozen=True)
class EagleSequence:
    """A prompt and the target's answer, with the target's features of all positions."""

    tokens: torch.Tensor  # [n] int64: the prompt, then the answer
    features: torch.Tensor  # [n - 1, H] f_0 .. f_{n-2} (the last token's is never needed)
    answer_start: int  # index of the answer's first token: the prompt's length
    # [answer_start - 1] the target's greedy next token after each prompt position but the
    # last, the labels of the prompt's rows; None: only rows labelled in the answer count
    prompt_labels: torch.Tensor | None = None

    @classmethod
    def of(
        cls, prompt: list[int], answer: Answer, lm_head: torch.Tensor | None = None
    ) -> EagleSequence:
        """``lm_head`` (the target's weight): the prompt's rows are trained on too."""
        if answer.prefill is None:
            raise ValueError(
                "EAGLE needs every prompt position's features: generate the "
                "answers with prefill=True"
            )
        features = torch.cat([answer.prefill, answer.hidden]).float()
        labels = None if lm_head is None else greedy_next(answer.prefill, lm_head)
        return cls(torch.tensor(prompt + answer.tokens), features, len(prompt), labels)

    def labels(self) -> torch.Tensor:
        """[n] the token the target writes at each index after the tokens before it (the
        answer's own; in the prompt, ``prompt_labels``), IGNORE where none is trained on."""
        labels = self.tokens.clone()
        labels[: self.answer_start] = IGNORE
        if self.prompt_labels is not None:
            labels[1 : self.answer_start] = self.prompt_labels
        return labels

    @property
    def counted(self) -> int:
        """Rows of step 1 in the loss: t whose x_{t+2} is labelled, t = 0 .. n - 3."""
        return int((self.labels()[2:] != IGNORE).sum())


@dataclass(frozen=True)
class Batch:
    """Sequences padded to one length: S pair rows each, room for ``steps`` unrolled steps."""

    features: torch.Tensor  # [B, S + unroll, H] f_t, zero past a sequence's end
    tokens: torch.Tensor  # [B, S + unroll + 1] x_t, zero past the end
    labels: torch.Tensor  # [B, S + unroll + 1] ``EagleSequence.labels``, IGNORE past the end
    lengths: torch.Tensor  # [B] n: each sequence's token count
    size: int  # S: the longest sequence's pair rows (n - 1)
    steps: int  # steps trained per pair row (``EagleOptions.unroll``)

    @classmethod
    def of(cls, sequences: list[EagleSequence], unroll: int) -> Batch:
        size = max(len(s.tokens) for s in sequences) - 1
        hidden = sequences[0].features.shape[1]
        features = sequences[0].features.new_zeros(len(sequences), size + unroll, hidden)
        tokens = torch.zeros(len(sequences), size + unroll + 1, dtype=torch.long)
        labels = torch.full_like(tokens, IGNORE)
        for row, seq in enumerate(sequences):
            features[row, : len(seq.features)] = seq.features
            tokens[row, : len(seq.tokens)] = seq.tokens
            labels[row, : len(seq.tokens)] = seq.labels()
        lengths = torch.tensor([len(s.tokens) for s in sequences])
        return cls(features, tokens, labels, lengths, size, unroll)

    def step(self, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Step k's (1-based) rows t = 0 .. S - 1, rooted at pair t: the token it reads
        x_{t+k} and its position t + k - 1, and its targets f_{t+k} and the label of
        index t + k + 1 (IGNORE where it has none). Step 1 reads f_t; step k > 1 reads
        step k - 1's output."""
        rows = torch.arange(self.size)
        read = self.tokens[:, k : k + self.size]  # [B, S]
        truth = self.labels[:, k + 1 : k + 1 + self.size]
        positions = (rows + k - 1).expand(len(self.lengths), -1)
        return read, positions, self.features[:, k : k + self.size], truth


def unrolled_mask(size: int, steps: int, lengths: torch.Tensor, dtype) -> torch.Tensor:
    """Additive mask [B, 1, steps * S, steps * S] over rows (step, t): step 1 is causal;
    (k, t) sees step 1's rows 0 .. t and its own root's rows of steps 2 .. k, as a draft
    tree's node sees the committed prefix and its ancestors. Pair rows past a sequence's
    end are hidden from the others (their own rows are ignored by the loss)."""
    rows = torch.arange(size)
    causal = rows[None] <= rows[:, None]
    allowed = torch.zeros(steps * size, steps * size, dtype=torch.bool)
    for k in range(steps):
        allowed[k * size : (k + 1) * size, :size] = causal
        for j in range(1, k + 1):
            allowed[k * size + rows, j * size + rows] = True
    valid = (rows[None] < (lengths[:, None] - 1)).repeat(1, steps)  # [B, steps*S]
    allowed = allowed[None] & valid[:, None, :]
    allowed |= torch.eye(steps * size, dtype=torch.bool)[None]  # a padded row sees itself
    mask = torch.zeros(allowed.shape, dtype=dtype)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[:, None]


# --- the head ------------------------------------------------------------------------


def new_head(model, init: str = "random") -> EagleHead:
    """A head for ``model`` (float32, on its device).

    random: PyTorch's default initialisation (upstream EAGLE's); measured best at depth 2+.
    identity: fc passes the feature through and the layer's output projections are zero,
        so the untrained head returns f_t: best at depth 1 only (``EagleOptions``).
    last-layer: fc as identity, the decoder layer a copy of the target's last one."""
    head = EagleHead(head_config(model.config)).to(model.lm_head.weight.device)
    if init == "random":
        return head
    hidden = head.hidden_size
    with torch.no_grad():
        # fc reads cat(embedding, feature): keep its default weights on the embedding half
        head.fc.weight[:, hidden:] = torch.eye(hidden)
        head.fc.bias.zero_()
        layer: Any = head.layers[0]  # a transformers decoder layer
        if init == "last-layer":
            source = model.model.layers[-1]
            for name in ("self_attn", "mlp", "post_attention_layernorm"):
                getattr(layer, name).load_state_dict(getattr(source, name).state_dict())
        else:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    return head


# --- loss and training ---------------------------------------------------------------


def eagle_loss(
    head: EagleHead,
    embed,
    batch: Batch,
    weight: torch.Tensor,
    options: EagleOptions,
    scale: float,
    generator: torch.Generator | None = None,
    vocab: TrainingVocab | None = None,
) -> torch.Tensor:
    """Sum over the batch's unrolled steps of feature_weight * SmoothL1(output / scale, f / scale)
    + token_weight * CE(lm_head(output), x), each a mean over the step's counted rows.

    ``scale`` (the features' RMS) makes the feature loss and the noise independent of the
    target's feature size. Step k > 1 reads step k - 1's output computed without gradient
    (one extra forward per step, not a backward through it). ``vocab``: the tokens
    ``weight`` holds the rows of (the whole vocabulary when None)."""
    size, steps = batch.size, batch.steps
    inputs = [batch.step(k) for k in range(1, steps + 1)]
    features = batch.features[:, :size]
    if options.noise > 0:
        noise = torch.randn(features.shape, generator=generator).to(features.device)
        features = features + noise * (options.noise * scale)
    embeds = [embed(read.to(features.device)).detach() for read, _, _, _ in inputs]
    positions = [pos.to(features.device) for _, pos, _, _ in inputs]
    read_features = [features]
    for k in range(1, steps + 1):
        mask = unrolled_mask(size, k, batch.lengths, features.dtype).to(features.device)
        last = k == steps
        with torch.set_grad_enabled(last and torch.is_grad_enabled()):
            out = head(
                torch.cat(read_features, 1),
                torch.cat(embeds[:k], 1),
                torch.cat(positions[:k], 1),
                mask=mask,
            )
        if not last:
            read_features.append(out[:, (k - 1) * size :].detach())
    total = out.new_zeros(())
    for k, (_, _, target, truth) in enumerate(inputs):
        counted = truth != IGNORE
        count = int(counted.sum())
        if count == 0:
            continue
        rows = out[:, k * size : (k + 1) * size][counted]
        feature_loss = F.smooth_l1_loss(rows / scale, target.to(rows.device)[counted] / scale)
        labels = truth[counted] if vocab is None else vocab.map(truth[counted])
        kept = labels != IGNORE  # a token outside the training vocabulary: no token loss
        token_loss = FrozenProjectionCE.apply(
            rows[kept],
            weight,
            labels[kept].to(rows.device),
            rows.new_full((int(kept.sum()),), 1.0 / count),
        )
        total = total + options.feature_weight * feature_loss + options.token_weight * token_loss
    return total


def feature_scale(sequences: list[EagleSequence]) -> float:
    """Root mean square of the features: the unit of the noise and the feature loss."""
    squares = sum(float(s.features.pow(2).sum()) for s in sequences)
    return (squares / sum(s.features.numel() for s in sequences)) ** 0.5


def train_eagle_head(
    head: EagleHead,
    model,
    sequences: list[EagleSequence],
    options: EagleOptions,
    seconds: float | None = None,
) -> TrainStats:
    """AdamW on fc and the decoder layer, minibatches of whole sequences (see
    ``training.loop.train_loop``); the target's embedding and lm_head stay frozen."""
    sequences = [s for s in sequences if s.counted > 0]
    if not sequences:
        raise AutotuneError(
            "the target's answers are too short to train an EAGLE head on "
            "(every answer ended after one token): use other prompts"
        )
    lm_head = model.lm_head.weight.detach()
    labels = torch.cat([s.labels() for s in sequences])
    vocab = TrainingVocab.of(labels, lm_head.shape[0], options.train_vocab)
    weight = vocab.weight(lm_head).to(loss_dtype(options.loss_dtype))
    embed = model.get_input_embeddings()
    scale = feature_scale(sequences)
    generator = torch.Generator().manual_seed(options.seed)
    params = [p for name, p in head.named_parameters() if not name.startswith("rotary.")]

    def loss_of(indices: torch.Tensor) -> torch.Tensor:
        batch = Batch.of([sequences[i] for i in indices.tolist()], options.unroll)
        return eagle_loss(head, embed, batch, weight, options, scale, generator, vocab)

    head.train()
    try:
        return train_loop(
            params, options, len(sequences), options.sequences_per_step, seconds, loss_of
        )
    finally:
        head.eval()


# --- report --------------------------------------------------------------------------


@dataclass(frozen=True)
class DepthScore:
    """The head's accuracy at one draft depth on held-back answers: depth d reads its own
    d - 1 step extrapolation (as when drafting), not the target's features."""

    UNIT: ClassVar[str] = "depth"  # the first column of ``training.report.accuracy_table``

    depth: int
    offset: int  # tokens ahead of the feature f_t it starts from (d + 1)
    top1: float
    top5: float
    positions: int  # draft roots it was measured on


@torch.inference_mode()
def eagle_accuracy(
    head: EagleHead, model, sequences: list[EagleSequence], depth: int
) -> list[DepthScore]:
    """Per-depth top-1 / top-5 along each answer, from the features captured with it
    (``measure.eagle_accuracy.extrapolation_ranks``; the same figures as
    ``measure_eagle_accuracy`` without a second pass of the target)."""
    from autotune.engine.runner import Runner
    from autotune.measure.eagle_accuracy import tally_extrapolation
    from autotune.measure.head_accuracy import RankTally

    runner = Runner(model)  # only its embedding and lm_head
    tally = RankTally(depth, max_rank=5)
    for seq in sequences:
        n, first = len(seq.tokens), seq.answer_start - 1  # root whose next token is answer[0]
        if n - 1 <= first:
            continue
        tally_extrapolation(
            tally, head, runner, seq.features.to(runner.device), seq.tokens.tolist(), first
        )
    accuracy = tally.accuracy()
    return [
        DepthScore(d + 1, d + 2, accuracy.top1[d], accuracy.top5[d], accuracy.positions[d])
        for d in range(depth)
    ]


# --- the job -------------------------------------------------------------------------


# The smallest draft vocabulary the packaged search space tries (methods/eagle/space.yaml).
SMALLEST_DRAFT_VOCAB = 1024


class EagleTrainer(HeadTrainer):
    """An EAGLE head: fc and one decoder layer over the target's features and the next
    token's embedding (``train_eagle_head``)."""

    METHOD = (
        "EAGLE-1/2 self-distillation: frozen target, embedding and "
        "lm_head; fc and one decoder layer trained"
    )
    LOSS = "final_loss"

    def prefill(self, options: EagleOptions) -> bool:
        return True  # the head attends over the prompt's features too

    def examples(
        self, view, answers: AnswerSplit, options: EagleOptions
    ) -> tuple[list[EagleSequence], list[EagleSequence]]:
        lm_head = view.lm_head.weight if options.prompt_positions else None
        train = [EagleSequence.of(prompt, answer, lm_head) for prompt, answer in answers.train]
        held = [EagleSequence.of(prompt, answer) for prompt, answer in answers.held_back]
        return train, held

    def fit(
        self, view, examples: list[EagleSequence], options: EagleOptions, seconds: float | None
    ) -> tuple[EagleHead, TrainStats]:
        head = new_head(view, options.init)
        return head, train_eagle_head(head, view, examples, options, seconds)

    def accuracy(
        self, trained: EagleHead, view, examples: list[EagleSequence], options: EagleOptions
    ) -> list:
        return eagle_accuracy(trained, view, examples, options.depth)

    def save(self, result: TrainResult, folder: Path, target, base_model: str, extra: dict):
        embed = target.model.get_input_embeddings().weight
        saved = save_eagle_head(result.trained, folder, embed, base_model, extra)
        save_draft_vocab(saved, result.token_counts)
        return saved

    def level_seconds(self, result: TrainResult, runner) -> float:
        """The head's layer over one node and the smallest draft vocabulary's logits (the
        cheapest drafting level the search could choose)."""
        from autotune.heads.eagle import DraftProjection
        from autotune.measure.eagle_accuracy import measure_level_costs

        counts = result.token_counts
        ranked = sorted(counts, key=lambda t: -counts[t])
        projection = DraftProjection(runner.lm_head, ranked[:SMALLEST_DRAFT_VOCAB] or None)
        return measure_level_costs(runner, result.trained, (1,), 128, 9, projection)[1]


# Generate answers, train a head on the search prompts' answers, report per-depth accuracy
# on the held-back ones (``HeadTrainer.train``).
train_eagle = EagleTrainer().train
