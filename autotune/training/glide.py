"""Train a GLIDE draft for a frozen target by self-distillation.

The data are token sequences, each a prompt and the target's own greedy answer (a plain
list of (token ids, answer start): any self-distillation set can feed it). The target's
KV cache for a sequence comes from one frozen teacher-forced forward of our runner over
it; the draft reads the cached keys and values of its target layers. Row i of the draft
reads token i and learns token i + 1, the target's greedy token, where that token lies in
the answer (the prompt is text the target did not write).

As the reference trains it: the draft's cross-attention sees the target's cache through
a block mask (block length 5): every position sees the cache only below its block's
start, so the k-th position of a block learns to draft from a cache stale by k + 1
tokens, as draft step k does from a root. The blocks' alignment moves with every
minibatch (a random shift per sequence), so every position is drafted at every
staleness. AdamW, lr 5e-4, betas (0.9, 0.95), warmup then cosine decay.

The draft shares the target's frozen embedding and lm_head; its layers, norms and cross
projections are trained. ``init="target"`` warm-starts them from the target's own
weights: draft layer m's self-attention from target layer m (both read embeddings), its
cross-attention projections, MLP and norms from the target layer it reads, its final
norm from the target's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch

from autotune.engine.runner import Runner
from autotune.errors import AutotuneError
from autotune.heads.eagle import DraftProjection, save_draft_vocab
from autotune.heads.glide import (
    GlideDraft,
    block_limits,
    new_glide_draft,
    save_glide_draft,
    stale_visibility,
    teacher_cache,
)
from autotune.progress import step
from autotune.training.distill import GENERATION_BATCH
from autotune.training.loop import TrainStats, train_loop
from autotune.training.loss import IGNORE, FrozenProjectionCE, loss_dtype
from autotune.training.trainer import AnswerSplit, HeadTrainer, TrainResult

INITS = ("target", "random")
BETAS = (0.9, 0.95)  # the reference's AdamW betas

Sequence = tuple[list[int], int]  # token ids (prompt, then answer) and the answer's start


@dataclass(frozen=True)
class GlideOptions:
    max_new_tokens: int = 128  # answer length (tokens) per calibration prompt
    epochs: int = 40  # an upper bound: the time budget ends training first
    # Seconds for answer generation and training together (the held-back report and
    # saving come after); training ends early to keep it (but trains at least a minute:
    # generating the default answers took 11 min on 2 cores shared with other work).
    time_budget_s: float | None = 600.0
    layers: int | None = None  # draft layers; None: sized for the device (``default_layers``)
    block: int = 5  # block length of the training mask (the reference's)
    sequences_per_step: int = 4
    lr: float = 5e-4
    weight_decay: float = 0.0
    init: str = "target"  # see ``new_draft``
    depth: int = 5  # draft steps in the held-back report
    loss_dtype: str = "auto"  # of the vocabulary product; see ``training.loss.loss_dtype``
    generation_batch: int = GENERATION_BATCH
    seed: int = 0

    def __post_init__(self):
        if self.init not in INITS:
            raise AutotuneError(f"unknown GLIDE draft init '{self.init}': use {', '.join(INITS)}")
        if self.block < 1 or self.depth < 1 or self.sequences_per_step < 1:
            raise AutotuneError("block, depth and sequences_per_step must be at least 1")
        if self.layers is not None and self.layers < 1:
            raise AutotuneError("a GLIDE draft needs at least one layer")


def default_layers(device: torch.device) -> int:
    """One layer on a CPU (a few minutes of training on 2 cores); two on an accelerator."""
    return 1 if device.type == "cpu" else 2


# --- data ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Example:
    """A sequence and the target's cached keys/values of the layers the draft reads."""

    tokens: torch.Tensor  # [n]
    answer_start: int
    keys: list[torch.Tensor]  # per draft layer [kv_heads, n, head_dim]
    values: list[torch.Tensor]

    @property
    def counted(self) -> int:
        """Rows in the loss: those whose next token lies in the answer."""
        return max(0, len(self.tokens) - max(self.answer_start, 1))


def examples(runner: Runner, draft: GlideDraft, sequences: list[Sequence]) -> list[Example]:
    """Each sequence with its target KV, from one frozen teacher-forced forward."""
    out = []
    with step("target KV of the training sequences", len(sequences)) as advance:
        for tokens, start in sequences:
            target = draft.read_target(teacher_cache(runner, tokens), len(tokens))
            out.append(
                Example(
                    torch.tensor(tokens),
                    start,
                    [k[0].clone() for k, _ in target],
                    [v[0].clone() for _, v in target],
                )
            )
            advance()
    return out


@dataclass(frozen=True)
class Batch:
    """Sequences padded to one length N."""

    tokens: torch.Tensor  # [B, N]
    labels: torch.Tensor  # [B, N] token i + 1 where it counts, else IGNORE
    target_kv: list[tuple[torch.Tensor, torch.Tensor]]  # per draft layer [B, kv, N, D]
    cross_mask: torch.Tensor  # [B, 1, N, N] bool: the block mask over the target's cache

    @classmethod
    def of(cls, items: list[Example], block: int, shifts: list[int]) -> Batch:
        size = max(len(e.tokens) for e in items)
        tokens = torch.zeros(len(items), size, dtype=torch.long)
        labels = torch.full((len(items), size), IGNORE, dtype=torch.long)
        for row, e in enumerate(items):
            n = len(e.tokens)
            tokens[row, :n] = e.tokens
            counted = torch.arange(1, n) >= e.answer_start  # next token in the answer
            labels[row, : n - 1] = torch.where(counted, e.tokens[1:], IGNORE)
        target_kv = [
            (_padded([e.keys[m] for e in items], size), _padded([e.values[m] for e in items], size))
            for m in range(len(items[0].keys))
        ]
        # padding lies past every real row's view (a row sees below its own position)
        cross = torch.stack([stale_visibility(block_limits(size, block, s), size) for s in shifts])
        return cls(tokens, labels, target_kv, cross[:, None])


def _padded(parts: list[torch.Tensor], size: int) -> torch.Tensor:
    out = parts[0].new_zeros(len(parts), parts[0].shape[0], size, parts[0].shape[2])
    for row, part in enumerate(parts):
        out[row, :, : part.shape[1]] = part
    return out


# --- the draft -----------------------------------------------------------------------


def new_draft(model, layers: int, init: str = "target") -> GlideDraft:
    """A draft for ``model`` (float32, on its device).

    target: warm-started from the target's own weights (see the module's docstring);
    random: PyTorch's default initialisation, norms at one."""
    draft = new_glide_draft(model.config, layers).to(model.lm_head.weight.device)
    if init == "target":
        _warm_start(draft, model)
    return draft


@torch.no_grad()
def _warm_start(draft: GlideDraft, model) -> None:
    inner = model.model
    for m, target_layer in enumerate(draft.target_layers):
        layer: Any = draft.layers[m]  # submodules named by convention
        early, read = inner.layers[min(m, len(inner.layers) - 1)], inner.layers[target_layer]
        layer.input_layernorm.load_state_dict(early.input_layernorm.state_dict())
        layer.self_attn.load_state_dict(early.self_attn.state_dict(), strict=False)
        layer.cross_norm.load_state_dict(read.input_layernorm.state_dict())
        layer.cross_attn.q_proj.weight.copy_(read.self_attn.q_proj.weight)
        layer.cross_attn.o_proj.weight.copy_(read.self_attn.o_proj.weight)
        layer.post_attention_layernorm.load_state_dict(read.post_attention_layernorm.state_dict())
        layer.mlp.load_state_dict(read.mlp.state_dict())
    draft.norm.load_state_dict(inner.norm.state_dict())


# --- loss and training ---------------------------------------------------------------


def glide_loss(draft: GlideDraft, embed, weight: torch.Tensor, batch: Batch) -> torch.Tensor:
    """Mean cross-entropy of the draft's next-token prediction over the counted rows,
    through the frozen lm_head ``weight``."""
    device = weight.device
    hidden = draft(
        embed(batch.tokens.to(device)).detach(),
        torch.arange(batch.tokens.shape[1], device=device)[None],
        [(k.to(device), v.to(device)) for k, v in batch.target_kv],
        batch.cross_mask.to(device),
    )
    counted = batch.labels != IGNORE
    count = int(counted.sum())
    rows = hidden[counted.to(device)]
    return FrozenProjectionCE.apply(
        rows, weight, batch.labels[counted].to(device), rows.new_full((count,), 1.0 / count)
    )


def train_glide_draft(
    draft: GlideDraft,
    runner: Runner,
    sequences: list[Sequence],
    options: GlideOptions,
    seconds: float | None = None,
) -> TrainStats:
    """AdamW (the reference's betas) on the draft's parameters, minibatches of whole
    sequences (``training.loop.train_loop``), for at most ``seconds`` (the target's
    teacher forwards included); the target stays frozen."""
    began = time.perf_counter()
    data = [e for e in examples(runner, draft, sequences) if e.counted > 0]
    if seconds is not None:  # the teacher forwards count against the training time
        seconds = max(seconds - (time.perf_counter() - began), 1.0)
    if not data:
        raise AutotuneError(
            "the target's answers are too short to train a GLIDE draft on "
            "(every answer ended after one token): use other prompts"
        )
    embed, lm_head = draft.vocabulary(runner)
    weight = lm_head.weight.detach().to(loss_dtype(options.loss_dtype))
    generator = torch.Generator().manual_seed(options.seed)
    trainable = [p for name, p in draft.named_parameters() if name.split(".")[0] == "layers"]
    trainable.append(draft.norm.weight)

    def loss_of(indices: torch.Tensor) -> torch.Tensor:
        shifts = torch.randint(0, options.block, (len(indices),), generator=generator).tolist()
        batch = Batch.of([data[i] for i in indices.tolist()], options.block, shifts)
        return glide_loss(draft, embed, weight, batch)

    draft.requires_grad_(False)
    for p in trainable:
        p.requires_grad_(True)
    draft.train()
    try:
        # a parameter group carries the betas: train_loop builds AdamW with its defaults
        return train_loop(
            [{"params": trainable, "betas": BETAS}],
            options,
            len(data),
            options.sequences_per_step,
            seconds,
            loss_of,
        )
    finally:
        draft.eval().requires_grad_(False)


# --- report --------------------------------------------------------------------------


@dataclass(frozen=True)
class StepScore:
    """The draft's accuracy at one drafting step on held-back answers, drafting from the
    target's cache as it stands at the root (step k reads the true tokens before it)."""

    UNIT: ClassVar[str] = "step"  # the first column of ``training.report.accuracy_table``

    step: int
    offset: int  # tokens ahead of the root it predicts
    top1: float
    top5: float
    positions: int  # roots it was measured on


def glide_accuracy(
    draft: GlideDraft, runner: Runner, sequences: list[Sequence], depth: int
) -> list[StepScore]:
    """Per-step top-1 / top-5 along each answer (``measure.glide_accuracy``), from the
    first root decoding drafts from: the answer's first token."""
    from autotune.measure.glide_accuracy import draft_steps, step_accuracy

    _, lm_head = draft.vocabulary(runner)
    steps = [
        draft_steps(runner, draft, tokens, start, depth)
        for tokens, start in sequences
        if len(tokens) - 1 > start
    ]
    if not steps:
        return []
    accuracy = step_accuracy(steps, DraftProjection(lm_head), max_rank=5)
    return [
        StepScore(d + 1, d + 1, accuracy.top1[d], accuracy.top5[d], accuracy.positions[d])
        for d in range(depth)
    ]


# --- the job -------------------------------------------------------------------------


class GlideTrainer(HeadTrainer):
    """A GLIDE draft: a small decoder whose layers also read the target's KV cache
    (``train_glide_draft``)."""

    METHOD = (
        "GLIDE self-distillation: frozen target, embedding and lm_head; draft layers "
        "reading the target's KV cache through a block mask trained"
    )
    LOSS = "final_loss"

    def view(self, target, runner=None) -> Runner:
        # the run's own where there is one: on a GPU a second runner would record its
        # steps and lay out its cache again
        return runner if runner is not None else Runner(target.model)

    def examples(
        self, view, answers: AnswerSplit, options: GlideOptions
    ) -> tuple[list[Sequence], list[Sequence]]:
        train = [(prompt + answer.tokens, len(prompt)) for prompt, answer in answers.train]
        held = [(prompt + answer.tokens, len(prompt)) for prompt, answer in answers.held_back]
        return train, held

    def fit(
        self, view: Runner, examples: list[Sequence], options: GlideOptions, seconds
    ) -> tuple[GlideDraft, TrainStats]:
        layers = options.layers or default_layers(view.device)
        draft = new_draft(view.model, layers, options.init)
        return draft, train_glide_draft(draft, view, examples, options, seconds)

    def accuracy(
        self, trained: GlideDraft, view: Runner, examples: list[Sequence], options
    ) -> list:
        return glide_accuracy(trained, view, examples, options.depth)

    def save(self, result: TrainResult, folder: Path, target, base_model: str, extra: dict):
        saved = save_glide_draft(result.trained, folder, base_model, extra)
        save_draft_vocab(saved, result.token_counts)
        return saved

    def shape_record(self, trained: GlideDraft) -> dict:
        """The draft's layers and the target layers whose cache each reads, as trained."""
        return {
            "draft": {"layers": len(trained.layers), "target_layers": list(trained.target_layers)}
        }


# Generate answers, train a draft on the search prompts' answers, report per-step accuracy
# on the held-back ones (``HeadTrainer.train``).
train_glide = GlideTrainer().train
