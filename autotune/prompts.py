"""Prompt files (JSONL) and the search / held-back split.

A line is MT-bench / Spec-Bench style, `{"question_id": 81, "category": "writing",
"turns": ["...", ...]}` (the first turn is the prompt), or `{"prompt": "..."}` with an
optional "id" and "category".
"""

from __future__ import annotations

import json
import random
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.errors import AutotuneError, PromptsFileError

_EXPECTED = 'expected {"prompt": "..."} or {"question_id": ..., "turns": ["..."]}'


@dataclass(frozen=True)
class Prompt:
    id: str
    text: str
    category: str | None = None
    followups: tuple[str, ...] = ()  # later user turns (MT-bench's second turn)


def default_prompts_path() -> Path:
    """The packaged MT-bench first turns (80 prompts, 8 categories)."""
    return Path(__file__).parent / "data" / "mt_bench.jsonl"


def packaged_prompt_files() -> list[Path]:
    """The calibration prompts autotune ships: MT-bench (open chat) and the Spec-Bench
    development set (200 prompts over five workload categories)."""
    return [default_prompts_path(), Path(__file__).parent / "data" / "specbench_dev.jsonl"]


def _parse_line(record: Any, where: str, line_no: int) -> Prompt:
    if not isinstance(record, dict):
        raise PromptsFileError(f"{where}: a JSON object is needed, {_EXPECTED}")
    if "turns" in record:
        turns = record["turns"]
        if not isinstance(turns, list) or not turns:
            raise PromptsFileError(f"{where}: 'turns' must be a non-empty list of strings")
        text, default_id = turns[0], record.get("question_id", line_no)
        followups = tuple(t for t in turns[1:] if isinstance(t, str) and t.strip())
    elif "prompt" in record:
        text, default_id = record["prompt"], line_no
        followups = ()
    else:
        raise PromptsFileError(f"{where}: no 'prompt' or 'turns' field, {_EXPECTED}")
    if not isinstance(text, str) or not text.strip():
        raise PromptsFileError(f"{where}: the prompt text is empty or not a string")
    category = record.get("category")
    return Prompt(
        id=str(record.get("id", default_id)),
        text=text,
        category=None if category is None else str(category),
        followups=followups,
    )


def load_prompts(path: str | Path) -> list[Prompt]:
    """Read a JSONL prompt file; any problem is a one-line PromptsFileError naming file and line."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise PromptsFileError(f"prompts file {path} not found: pass an existing JSONL file")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise PromptsFileError(
            f"cannot read prompts file {path} ({e}): pass a UTF-8 JSONL file"
        ) from None
    prompts: list[Prompt] = []
    seen: set[str] = set()
    for line_no, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path} line {line_no}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise PromptsFileError(f"{where}: not valid JSON ({e.msg}), {_EXPECTED}") from None
        prompt = _parse_line(record, where, line_no)
        if prompt.id in seen:
            raise PromptsFileError(
                f"{where}: duplicate id '{prompt.id}', give each prompt its own id"
            )
        seen.add(prompt.id)
        prompts.append(prompt)
    if not prompts:
        raise PromptsFileError(f"prompts file {path} has no prompts: {_EXPECTED}, one per line")
    return prompts


def _held_back_counts(sizes: dict[str, int], total_held: int) -> dict[str, int]:
    """Share `total_held` among groups in proportion to their size (largest remainder)."""
    n = sum(sizes.values())
    quotas = {g: size * total_held / n for g, size in sizes.items()}
    counts = {g: int(q) for g, q in quotas.items()}
    by_remainder = sorted(sizes, key=lambda g: (-(quotas[g] - counts[g]), g))
    for g in by_remainder[: total_held - sum(counts.values())]:
        counts[g] += 1
    return counts


def split_prompts(
    prompts: list[Prompt], held_back_fraction: float = 0.25, seed: int = 0
) -> tuple[list[Prompt], list[Prompt]]:
    """(search, held_back): disjoint, deterministic for a seed, stratified by category.

    Settings are searched on one part and confirmed on the other, so a profile's speedup
    is not measured on the prompts it was fitted to. Both parts are non-empty when there
    are at least two prompts; each keeps the file's order.
    """
    if not 0.0 < held_back_fraction < 1.0:
        raise AutotuneError(
            f"held-back fraction {held_back_fraction} is out of range: use a value between 0 and 1"
        )
    n = len(prompts)
    if n < 2:
        return list(prompts), []
    total_held = min(max(round(n * held_back_fraction), 1), n - 1)
    groups: dict[str, list[int]] = defaultdict(list)
    for i, p in enumerate(prompts):
        groups[p.category or ""].append(i)  # no category: one group, a plain random split
    counts = _held_back_counts({g: len(ix) for g, ix in groups.items()}, total_held)
    rng = random.Random(seed)
    held: set[int] = set()
    for g in sorted(groups):
        held.update(rng.sample(groups[g], counts[g]))
    search = [p for i, p in enumerate(prompts) if i not in held]
    held_back = [p for i, p in enumerate(prompts) if i in held]
    return search, held_back
