"""A method's schedule under load (the profile's ``load`` block) in each engine's terms.

- vLLM: ``num_speculative_tokens_per_batch_size``, ``[[lo, hi, K], ...]``: inclusive
  batch-size ranges from 1, non-overlapping; K = 0 turns speculation off; batch sizes past
  the last range keep its K; K is capped at ``num_speculative_tokens``.
- TensorRT-LLM: ``max_concurrency`` turns speculation off above a batch size; its
  ``draft_len_schedule`` (per-batch draft lengths) excludes it, and its NGram drafter has
  no dynamic draft length, so for n-gram only the cut-off is written.
- SGLang: ``--speculative-adaptive-config``, a JSON file of slots keyed by batch size
  (a batch takes the largest key at or below its size, after CUDA-graph padding), each
  with the draft steps it may choose among (0: off); it serves EAGLE with topk 1 only:
  for other methods the schedule is said, not written.
- llama.cpp: no batch gate: the crossover is said in a comment.
"""

from __future__ import annotations

from autotune.measure.load import requests_text
from autotune.profile.blocks import Load


def vllm_schedule(load: Load | None, tokens: int) -> list[list[int]] | None:
    """``[[lo, hi, K], ...]`` for ``tokens`` speculative tokens: each measured level's
    range runs up to the next level's start; the last range is the last level alone,
    and vLLM keeps its K above it. None without measured levels."""
    if load is None or not load.levels:
        return None
    levels = sorted(load.levels, key=lambda level: level.concurrency)
    rows = []
    for index, level in enumerate(levels):
        low = 1 if index == 0 else level.concurrency
        high = levels[index + 1].concurrency - 1 if index + 1 < len(levels) else level.concurrency
        rows.append([low, high, draft_tokens_at(level, tokens)])
    return rows


def draft_tokens_at(level, tokens: int) -> int:
    """The draft length a level serves: 0 off, the cap where it has one, else ``tokens``."""
    if level.max_draft_tokens is None:
        return tokens
    return min(tokens, level.max_draft_tokens)


def sglang_adaptive_config(load: Load | None, steps: int) -> dict | None:
    """SGLang's adaptive config holding the schedule for an EAGLE chain of ``steps``: a
    slot per measured level, its one candidate the level's steps (0 off), so that SGLang
    serves the measured schedule instead of adapting away from it. None without levels."""
    if load is None or not load.levels:
        return None
    return {
        str(level.concurrency): {"candidate_steps": [draft_tokens_at(level, steps)]}
        for level in sorted(load.levels, key=lambda level: level.concurrency)
    }


def speculation_cutoff(load: Load | None) -> int | None:
    """The largest batch size that still speculates where a crossover was found (for
    ``max_concurrency``), else None."""
    if load is None or not load.crossover:
        return None
    return load.crossover - 1 if load.crossover > 1 else None


def load_note(load: Load | None, engine: str) -> str | None:
    """One line on what was measured under load, for an export's comments."""
    if load is None or not load.levels:
        return None
    parts = [f"{level.concurrency}: {level.setting} {level.speedup:.2f}x" for level in load.levels]
    crossing = (
        f"; speculation off from {requests_text(load.crossover)} in flight"
        if load.crossover
        else "; speculation paid at every level measured"
    )
    return (
        f"under load in autotune's engine (requests in flight: setting, throughput speedup "
        f"held back): {', '.join(parts)}{crossing} -- measured in autotune's engine, not "
        f"in {engine}"
    )


def unmeasured_above_warning(load: Load | None, title: str) -> list[str]:
    """Where speculation still paid at the highest level measured, what the engine does
    above it was not measured."""
    if load is None or not load.levels or load.crossover:
        return []
    top = max(level.concurrency for level in load.levels)
    return [
        f"{title} keeps the schedule's last setting above {requests_text(top)} in flight, where "
        f"nothing was measured: profile with a higher --concurrency if you serve more"
    ]


def add_vllm_schedule(
    config: dict, load: Load | None, warnings: list[str], notes: list[str], method: str
) -> None:
    """``num_speculative_tokens_per_batch_size`` into a vLLM ``speculative_config`` whose
    method's schedule under load was measured, with what it leaves unmeasured."""
    schedule = vllm_schedule(load, config["num_speculative_tokens"])
    if schedule is not None:
        config["num_speculative_tokens_per_batch_size"] = schedule
        warnings += unmeasured_above_warning(load, "vLLM")
        notes.append(
            "num_speculative_tokens_per_batch_size: [first, last batch size, tokens] per "
            "level measured under load (0: speculation off)"
            + (
                ""
                if method in ("eagle", "medusa")
                else "; vLLM documents it as tested with EAGLE, EAGLE-3 and DFlash: check "
                f"that your release's {method} proposer honours it"
            )
        )
    notes += [n for n in [load_note(load, "vLLM")] if n]


def add_trtllm_cutoff(
    config: dict, load: Load | None, warnings: list[str], notes: list[str], length: int
) -> None:
    """``max_concurrency`` into a TensorRT-LLM ``speculative_config`` where a crossover
    was found; the schedule's shorter drafts (not written: ``draft_len_schedule`` excludes
    ``max_concurrency``) said in a warning."""
    if load is None or not load.levels:
        return
    cutoff = speculation_cutoff(load)
    if cutoff is not None:
        config["max_concurrency"] = cutoff
        notes.append(
            f"max_concurrency {cutoff}: speculation off above {requests_text(cutoff)} in a "
            "batch, where it measured no faster under load"
        )
    shorter = {
        lv.concurrency: lv.max_draft_tokens
        for lv in load.levels
        if lv.max_draft_tokens and lv.max_draft_tokens < length
    }
    warnings += unmeasured_above_warning(load, "TensorRT-LLM")
    if shorter:
        warnings.append(
            "TensorRT-LLM takes either max_concurrency or a per-batch draft length "
            "(draft_len_schedule, for its one-model drafters): the schedule's shorter drafts "
            "at "
            + ", ".join(f"{requests_text(c)} ({t} tokens)" for c, t in shorter.items())
            + " are not written"
        )
    if load.crossover == 1:
        warnings.append(
            "speculation measured no faster at any concurrency under load: serve without it"
        )
    notes += [n for n in [load_note(load, "TensorRT-LLM")] if n]
