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

import contextlib
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, ClassVar, Iterator

import torch

from autotune.errors import AutotuneError, OutputPathError
from autotune.heads.medusa import MedusaHeads, save_medusa_heads
from autotune.progress import say, step

KINDS = ("medusa", "eagle")
IGNORE = -100  # label of a (position, head) pair whose token lies past the answer's end

# Greedy answers are generated this many prompts at a time (left-padded, prompts of
# similar length together): on 2 cores SmolLM2-135M took ~12 ms per token at batch 8 and
# ~7 ms at 16; at 32 the padded prefill grew faster than the per-token cost fell.
GENERATION_BATCH = 16
# Logit rows per matrix product in the loss: 512 x 49152 floats is ~100 MB.
LOSS_CHUNK_ROWS = 512
# Positions per chunk when measuring accuracy (all heads' logits at once, float32).
EVAL_CHUNK_POSITIONS = 96
# However long generation took, training gets at least this long.
MIN_TRAIN_S = 60.0
WARMUP_STEPS = 10


@dataclass(frozen=True)
class TrainOptions:
    num_heads: int = 5
    num_layers: int = 1
    max_new_tokens: int = 256      # answer length (tokens) per calibration prompt
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
    generation_batch: int = GENERATION_BATCH
    seed: int = 0


# --- data ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Answer:
    """One greedy answer and the hidden states the target produced it from."""

    tokens: list[int]     # ends at the first end-of-sequence token or at the length limit
    hidden: torch.Tensor  # [len(tokens), H]: row i is the state the base head turned
    #                       into tokens[i] (row 0: the prompt's last position), after the
    #                       final norm
    prefill: torch.Tensor | None = None  # [len(prompt) - 1, H]: the prompt's other
    #                       positions' states, when asked for (EAGLE reads every position)


@dataclass(frozen=True)
class HeadData:
    """Training or test pairs: each hidden state with the token every head should give."""

    features: torch.Tensor  # [N, H] float32
    labels: torch.Tensor    # [N, K] int64; labels[:, k] = token k + 2 ahead, or IGNORE
    tokens: int             # answer tokens these came from

    @classmethod
    def from_answers(cls, answers: list[Answer], num_heads: int) -> "HeadData":
        features, labels = [], []
        for answer in answers:
            count = len(answer.tokens) - 1  # the last token's state predicts nothing here
            if count < 1:
                continue
            tokens = torch.tensor(answer.tokens + [IGNORE] * num_heads)
            # row i: head k predicts tokens[i + k + 1] (the base head predicts tokens[i])
            index = torch.arange(count)[:, None] + torch.arange(1, num_heads + 1)[None, :]
            features.append(answer.hidden[:count])
            labels.append(tokens[index])
        if not features:
            raise AutotuneError("the target's answers are too short to train heads on "
                                "(every answer ended after one token): use other prompts")
        return cls(torch.cat(features).float().clone(), torch.cat(labels),
                   sum(len(a.tokens) for a in answers))

    @property
    def num_heads(self) -> int:
        return self.labels.shape[1]

    def positions(self) -> list[int]:
        """Pairs with a label, per head: head k has fewer than head 0."""
        return (self.labels != IGNORE).sum(0).tolist()


def eos_token_ids(model) -> set[int]:
    ids: set[int] = set()
    for config in (model.config, getattr(model, "generation_config", None)):
        eos = getattr(config, "eos_token_id", None)
        if eos is not None:
            ids.update(eos if isinstance(eos, (list, tuple)) else [eos])
    return ids


@contextlib.contextmanager
def _capture_final_norm(model, store: list[torch.Tensor],
                        on_forward: Callable[[], None] | None,
                        prefill: list[torch.Tensor] | None = None) -> Iterator[None]:
    """While active, each forward appends the last position's output of the final norm;
    with ``prefill``, the first forward's whole output [B, P, H] is kept there too."""
    norm = getattr(getattr(model, "model", None), "norm", None)
    if norm is None:
        raise AutotuneError(f"{type(model).__name__} has no model.norm: heads are trained "
                            "on LLaMA-family models only")

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
            return tokens[:i + 1]
    return tokens


def _generate_batch(model, prompts: list[list[int]], max_new_tokens: int, pad: int,
                    eos: set[int], on_forward, with_prefill: bool) -> list[Answer]:
    from transformers import GenerationConfig

    width = max(map(len, prompts))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])     # [B, P], left-padded
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    config = GenerationConfig(do_sample=False, max_new_tokens=max_new_tokens,
                              pad_token_id=pad, eos_token_id=sorted(eos) or None)
    store: list[torch.Tensor] = []
    prefill: list[torch.Tensor] | None = [] if with_prefill else None
    with _capture_final_norm(model, store, on_forward, prefill), torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    hidden = torch.stack(store, dim=1)                                      # [B, steps, H]
    answers = []
    for row, prompt in enumerate(prompts):
        tokens = _trim(out[row, width:].tolist(), eos)
        # the prompt's positions but its last (that one is hidden[row, 0]), padding left out
        before = prefill[0][row, width - len(prompt):width - 1] if prefill else None
        answers.append(Answer(tokens, hidden[row, :len(tokens)], before))
    return answers


def generate_answers(model, prompts: list[list[int]], max_new_tokens: int,
                     batch_size: int = GENERATION_BATCH, prefill: bool = False) -> list[Answer]:
    """The target's greedy answers to ``prompts`` (token ids, chat template applied) and
    their hidden states, captured from the same forwards: no second pass over the text.
    ``prefill``: keep the states of every prompt position too (``Answer.prefill``).
    Batches hold prompts of similar length; answers come back in the order of prompts."""
    eos = eos_token_ids(model)
    pad = getattr(model.generation_config, "pad_token_id", None)
    pad = pad if pad is not None else (min(eos) if eos else 0)  # masked out: any id will do
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    count = math.ceil(len(order) / batch_size)  # batches of near-equal size
    batches = [order[len(order) * b // count:len(order) * (b + 1) // count] for b in range(count)]
    answers: dict[int, Answer] = {}
    with step("greedy answers + hidden states", len(batches) * max_new_tokens) as advance:
        for batch in batches:
            done = [0]

            def forward_done():
                done[0] += 1
                advance()

            got = _generate_batch(model, [prompts[i] for i in batch], max_new_tokens, pad, eos,
                                  forward_done, prefill)
            advance(max_new_tokens - done[0])  # the batch stopped early: all rows ended
            answers.update(zip(batch, got))
    return [answers[i] for i in range(len(prompts))]


# --- loss ----------------------------------------------------------------------------

class _FrozenProjectionCE(torch.autograd.Function):
    """sum_r row_weight[r] * CE(rows[r] @ weight.T, target[r]), never holding all logits.

    The projection is frozen, so the only gradient needed is the rows': it is computed
    chunk by chunk in the forward pass, (softmax - onehot) @ weight, and kept."""

    @staticmethod
    def forward(ctx, rows, weight, targets, row_weights):
        total = rows.new_zeros(())
        grad = torch.empty_like(rows)
        for start in range(0, rows.shape[0], LOSS_CHUNK_ROWS):
            part = slice(start, start + LOSS_CHUNK_ROWS)
            logits = (rows[part].to(weight.dtype) @ weight.T).float()      # [c, V]
            target = targets[part, None]
            lse = logits.logsumexp(-1, keepdim=True)
            w = row_weights[part]
            total += ((lse - logits.gather(1, target))[:, 0] * w).sum()
            probs = logits.sub_(lse).exp_()                                  # softmax, in place
            probs.scatter_add_(1, target, probs.new_full(target.shape, -1.0))
            probs.mul_(w[:, None])
            grad[part] = (probs.to(weight.dtype) @ weight).to(rows.dtype)
        ctx.save_for_backward(grad)
        return total

    @staticmethod
    def backward(ctx, grad_output):
        (grad,) = ctx.saved_tensors
        return grad * grad_output, None, None, None


def heads_loss(feats: torch.Tensor, labels: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Sum over heads of each head's mean cross-entropy.

    feats: [K, B, H] the heads' inputs to the projection; labels: [B, K] (IGNORE allowed);
    weight: [V, H] the shared projection, in the dtype the product should run in. All
    heads' rows go through one matrix product with the one weight."""
    targets = labels.T                                                      # [K, B]
    valid = targets != IGNORE
    counts = valid.sum(1).clamp(min=1)                                      # [K]
    row_weights = (1.0 / counts.float())[:, None].expand_as(targets)[valid]
    return _FrozenProjectionCE.apply(feats[valid], weight, targets[valid], row_weights)


def loss_dtype(name: str) -> torch.dtype:
    """``auto``: bfloat16 where the CPU has native bfloat16 dot products (AVX512-BF16 or
    AMX). On a 2-core AVX512-BF16 CPU an epoch over SmolLM2's answers took 35 s instead of
    56 s, the heads' gradient was within 0.5% of float32's, and held-back accuracy after an
    epoch was the same. Elsewhere bfloat16 is emulated and slower: float32."""
    if name == "auto":
        return torch.bfloat16 if _cpu_has_bf16() else torch.float32
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16}
    if name not in dtypes:
        raise AutotuneError(f"unknown loss dtype '{name}': use auto, float32 or bfloat16")
    return dtypes[name]


def _cpu_has_bf16() -> bool:
    try:
        with open("/proc/cpuinfo") as stream:
            for line in stream:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return bool(flags & {"avx512_bf16", "amx_bf16"})
    except OSError:
        pass
    return False


# --- training ------------------------------------------------------------------------

@dataclass
class TrainStats:
    steps: int = 0
    epochs: float = 0.0           # epochs done (a fraction when time ran out)
    seconds: float = 0.0
    losses: list[float] = field(default_factory=list)  # per step: sum of the heads' means
    stopped_by_time: bool = False


def _lr_factor(step_index: int, progress: float) -> float:
    warmup = min(1.0, (step_index + 1) / WARMUP_STEPS)
    return warmup * 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))


def train_loop(params, options, count: int, per_step: int, seconds: float | None,
               loss_of: Callable[[torch.Tensor], torch.Tensor]) -> TrainStats:
    """AdamW on ``params`` over minibatches of ``per_step`` of ``count`` items (a new order
    each epoch; ``loss_of`` maps their indices to the loss), warmup then cosine decay over
    ``options.epochs`` epochs or ``seconds``, whichever ends first (the schedule follows
    the further along of the two). ``options`` gives lr, weight_decay, epochs and seed."""
    optimizer = torch.optim.AdamW(params, lr=options.lr, weight_decay=options.weight_decay)
    generator = torch.Generator().manual_seed(options.seed)
    per_epoch = math.ceil(count / per_step)
    total_steps = per_epoch * options.epochs
    stats = TrainStats()
    started = time.perf_counter()
    for epoch in range(options.epochs):
        order = torch.randperm(count, generator=generator)
        with step(f"training epoch {epoch + 1}/{options.epochs}", per_epoch) as advance:
            for start in range(0, count, per_step):
                elapsed = time.perf_counter() - started
                progress = stats.steps / total_steps
                if seconds is not None:
                    progress = max(progress, elapsed / seconds)
                if progress >= 1.0:
                    stats.stopped_by_time = True
                    break
                for group in optimizer.param_groups:
                    group["lr"] = options.lr * _lr_factor(stats.steps, progress)
                loss = loss_of(order[start:start + per_step])
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                stats.losses.append(loss.item())
                stats.steps += 1
                advance()
        if stats.stopped_by_time:
            break
    stats.epochs = stats.steps / per_epoch
    stats.seconds = time.perf_counter() - started
    return stats


def train_heads(heads: MedusaHeads, data: HeadData, options: TrainOptions,
                seconds: float | None = None) -> TrainStats:
    """AdamW on the residual blocks, minibatches of positions (see ``train_loop``)."""
    if not heads.shares_vocab_projection:
        raise ValueError("train_heads needs heads sharing the frozen lm_head "
                         "(call share_vocab_projection first)")
    weight = heads.vocab_weights()[0].detach().to(loss_dtype(options.loss_dtype))
    blocks = [p for head in heads.heads for p in head[:-1].parameters()]

    def loss_of(batch: torch.Tensor) -> torch.Tensor:
        return heads_loss(heads.features(data.features[batch]), data.labels[batch], weight)

    heads.train()
    try:
        return train_loop(blocks, options, data.features.shape[0], options.positions_per_step,
                          seconds, loss_of)
    finally:
        heads.eval()


# --- report --------------------------------------------------------------------------

@dataclass(frozen=True)
class HeadScore:
    """One head's accuracy on held-back answers."""

    UNIT: ClassVar[str] = "head"  # what the first column of ``accuracy_table`` counts

    head: int
    offset: int       # tokens ahead of the hidden state it reads (k + 2)
    top1: float
    top5: float
    positions: int    # pairs it was measured on


@torch.inference_mode()
def head_accuracy(heads: MedusaHeads, data: HeadData) -> list[HeadScore]:
    """Top-1 / top-5 accuracy of every head, each over its own valid positions (float32)."""
    num_heads = min(heads.num_heads, data.num_heads)
    hits1 = torch.zeros(num_heads, dtype=torch.long)
    hits5 = torch.zeros(num_heads, dtype=torch.long)
    for start in range(0, data.features.shape[0], EVAL_CHUNK_POSITIONS):
        part = slice(start, start + EVAL_CHUNK_POSITIONS)
        logits = heads(data.features[part], num_heads)                      # [K, c, V]
        top = logits.topk(5, dim=-1).indices                                # [K, c, 5]
        target = data.labels[part, :num_heads].T[..., None]                 # [K, c, 1]
        hits1 += (top[..., :1] == target).any(-1).sum(-1)
        hits5 += (top == target).any(-1).sum(-1)
    positions = data.positions()[:num_heads]
    return [HeadScore(k, k + 2, hits1[k].item() / max(n, 1), hits5[k].item() / max(n, 1), n)
            for k, n in enumerate(positions)]


def accuracy_table(accuracy: list, title: str):
    """Rows of ``HeadScore`` (Medusa: one per head) or of a score type with another
    ``UNIT`` (EAGLE: one per draft depth); "predicts" counts from the position read."""
    from rich.table import Table

    unit = type(accuracy[0]).UNIT if accuracy else HeadScore.UNIT
    table = Table(title=title)
    for name in (unit, "predicts", "top-1", "top-5", "positions"):
        table.add_column(name, justify="right")
    for row in accuracy:
        table.add_row(str(getattr(row, unit)), f"t+{row.offset}", f"{row.top1:.3f}",
                      f"{row.top5:.3f}", str(row.positions))
    return table


# --- the job -------------------------------------------------------------------------

@dataclass
class TrainResult:
    METHOD: ClassVar[str] = "Medusa-1 self-distillation: frozen target, frozen shared lm_head"
    LOSS: ClassVar[str] = "final_loss_sum_over_heads"  # what stats.losses hold

    heads: MedusaHeads
    accuracy: list[HeadScore]   # on the held-back prompts' answers
    stats: TrainStats
    train_tokens: int
    held_back_tokens: int
    seconds: dict[str, float]

    def save(self, folder: Path, target, base_model: str, extra: dict) -> Path:
        return save_medusa_heads(self.heads, folder, base_model=base_model, extra=extra)


Pair = tuple[list[int], Answer]  # a prompt's token ids and the target's answer to it


def answer_prompts(target, search: list[list[int]], held_back: list[list[int]],
                   max_new_tokens: int, batch_size: int,
                   followups: list[tuple[str, str]] | None = None,
                   prefill: bool = False) -> tuple[list[Pair], list[Pair]]:
    """The target's answers: (prompt, answer) pairs to train on, and held-back ones.

    ``followups`` (first turn, second turn), one per search prompt with a second turn (in
    order, first), add a second round of answers to train on: the conversation so far is
    its prompt. ``prefill``: keep the states of every prompt position (EAGLE)."""
    model = target.model
    # one pool: batches of similar-length prompts, whichever split they belong to
    answers = generate_answers(model, search + held_back, max_new_tokens, batch_size, prefill)
    train = list(zip(search, answers[:len(search)]))
    if followups:
        conversations = [target.encode_conversation([first, target.decode(answer.tokens), second])
                         for (first, second), (_, answer) in zip(followups, train)]
        train += zip(conversations, generate_answers(model, conversations, max_new_tokens,
                                                     batch_size, prefill))
    return train, list(zip(held_back, answers[len(search):]))


def train_medusa(target, search: list[list[int]], held_back: list[list[int]],
                 options: TrainOptions, started: float | None = None,
                 followups: list[tuple[str, str]] | None = None) -> TrainResult:
    """Generate answers, train heads on the search prompts' answers, report accuracy on
    the held-back prompts' answers. ``started`` (perf_counter) is when the job began: the
    time budget counts from there. ``followups`` (first turn, second turn), one per search
    prompt with a second turn, add a second round of answers to train on: the data, not
    the epochs, limits the heads."""
    began = time.perf_counter()
    started = began if started is None else started
    model = target.model
    torch.manual_seed(options.seed)
    train_pairs, held_pairs = answer_prompts(target, search, held_back, options.max_new_tokens,
                                             options.generation_batch, followups)
    train = HeadData.from_answers([answer for _, answer in train_pairs], options.num_heads)
    held = HeadData.from_answers([answer for _, answer in held_pairs], options.num_heads)
    generated = time.perf_counter()
    heads = MedusaHeads(model.config.hidden_size, model.config.vocab_size, options.num_heads,
                        options.num_layers)
    # Train only the residual blocks: the projection stays the frozen base lm_head, shared
    # by every head, so at inference all heads cost one product with one weight on CPU.
    heads.share_vocab_projection(model.lm_head.weight)
    stats = train_heads(heads, train, options,
                        training_time(options.time_budget_s, started, generated))
    trained = time.perf_counter()
    accuracy = head_accuracy(heads, held)
    done = time.perf_counter()
    return TrainResult(heads, accuracy, stats, train.tokens, held.tokens,
                       {"generation": generated - began, "training": trained - generated,
                        "report": done - trained, "total": done - started})


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
        from autotune.heads.eagle_train import EagleOptions
        return EagleOptions()
    return TrainOptions()


def training_time(budget_s: float | None, started: float, now: float) -> float | None:
    """Seconds left for training when the budget counts from ``started``: at least
    ``MIN_TRAIN_S`` however long generation took; None: no limit."""
    return None if budget_s is None else max(budget_s - (now - started), MIN_TRAIN_S)


def check_out_folder(folder: Path) -> None:
    """Fail before any long work if the heads could not be written to ``folder`` (it is
    created now, as ``autotune profile`` creates its output's folder)."""
    if folder.exists() and not folder.is_dir():
        raise OutputPathError(f"{folder} is a file; --out needs a folder for the heads")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputPathError(f"cannot create {folder}: {exc.strerror}; choose another --out"
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
    options: object = None  # TrainOptions (medusa) or EagleOptions (eagle); None: defaults
    dtype: str = "float32"
    device: str = "cpu"


def run_heads_train(job: HeadsJob) -> tuple[TrainResult, Path]:
    """Check every input (cheap), then load the target, train, save the heads folder.
    Medusa heads or an EAGLE head, as ``job.kind`` says (the result has the same fields)."""
    from autotune.models import ALIASES, load_target, resolve_model
    from autotune.prompts import default_prompts_path, load_prompts, split_prompts

    started = time.perf_counter()
    defaults = default_options(job.kind)
    options = defaults if job.options is None else job.options
    if type(options) is not type(defaults):
        raise ValueError(f"{job.kind} heads take {type(defaults).__name__}, "
                         f"not {type(options).__name__}")
    prompts_path = Path(job.prompts).expanduser() if job.prompts else default_prompts_path()
    prompts = load_prompts(prompts_path)
    search, held_back = split_prompts(prompts)
    # A third of the search split is left to `autotune profile`, which must measure the
    # heads (accuracy, trees) on answers they were not trained on; the held-back split
    # stays unseen by both, for the final figures.
    search = heads_split(search)
    if not held_back:
        raise AutotuneError(f"{prompts_path} has one prompt: heads need at least two "
                            "(one to train on, one held back to measure them)")
    loss_dtype(options.loss_dtype)
    resolved = resolve_model(job.model, job.model_path)
    out = job.out or default_out(resolved.name, job.kind)
    check_out_folder(out)
    say(f"loading {resolved.name} from {resolved.path}")
    target = load_target(job.model, job.model_path, job.dtype, job.device)
    # second turns follow their first: answers to them need the first answers in context
    search = sorted(search, key=lambda p: not p.followups)
    followups = [(p.text, p.followups[0]) for p in search if p.followups]
    if job.kind == "eagle":
        from autotune.heads.eagle_train import train_eagle as train
    else:
        train = train_medusa
    result = train(target, [target.encode_chat(p.text) for p in search],
                   [target.encode_chat(p.text) for p in held_back], options, started, followups)
    # upstream configs name the Hugging Face repo; a local model is named by its path
    base = resolved.source if resolved.source in ALIASES.values() else str(resolved.path)
    record = _record(job.kind, options, target, prompts_path, (len(search), len(held_back)),
                     result, [p.id for p in search])
    result.save(out, target, base, {"autotune": record})
    return result, out


def _record(kind: str, options, target, prompts_path: Path, split: tuple[int, int],
            result: TrainResult, trained_on: list[str]) -> dict:
    """What config.json's "autotune" key says about how the heads were made."""
    stats = result.stats
    return {
        "trained_by": f"autotune heads train --kind {kind}",
        "method": result.METHOD,
        "model": target.name, "model_fingerprint": target.fingerprint,
        "prompts": {"file": str(prompts_path.resolve()), "train": split[0],
                    "held_back": split[1], "trained_on": trained_on},
        "tokens": {"max_new_tokens": options.max_new_tokens, "train": result.train_tokens,
                   "held_back": result.held_back_tokens},
        "training": {"epochs": round(stats.epochs, 3), "steps": stats.steps,
                     "stopped_by_time": stats.stopped_by_time,
                     result.LOSS: stats.losses[-1] if stats.losses else None},
        "options": {**asdict(options),
                    "loss_dtype": str(loss_dtype(options.loss_dtype)).removeprefix("torch.")},
        "accuracy_held_back": [asdict(row) for row in result.accuracy],
        "seconds": {k: round(v, 1) for k, v in result.seconds.items()},
    }
