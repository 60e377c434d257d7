"""The training loop every head kind shares: AdamW, warmup then cosine decay, bounded by
epochs or seconds."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from autotune import plan
from autotune.progress import step

WARMUP_STEPS = 10


@dataclass
class TrainStats:
    steps: int = 0
    epochs: float = 0.0  # epochs done (a fraction when time ran out)
    seconds: float = 0.0
    losses: list[float] = field(default_factory=list)  # per step: sum of the heads' means
    stopped_by_time: bool = False


def _lr_factor(step_index: int, progress: float) -> float:
    warmup = min(1.0, (step_index + 1) / WARMUP_STEPS)
    return warmup * 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))


def train_loop(
    params,
    options,
    count: int,
    per_step: int,
    seconds: float | None,
    loss_of: Callable[[torch.Tensor], torch.Tensor],
) -> TrainStats:
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
                loss = loss_of(order[start : start + per_step])
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


def training_time(budget_s: float | None, started: float, now: float) -> float | None:
    """Seconds left for training when the budget counts from ``started``: at least
    ``plan.LEAST_TRAINING_S`` however long generation took; None: no limit."""
    return None if budget_s is None else max(budget_s - (now - started), plan.LEAST_TRAINING_S)
