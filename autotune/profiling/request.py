"""What `autotune profile` was asked: the request, read once at the edge."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from autotune import plan
from autotune.errors import AutotuneError
from autotune.measure.load import LEVELS
from autotune.methods import registry
from autotune.studies.workers import Workers


@dataclass
class ProfileRequest:
    """What `autotune profile` was asked to do (the defaults are the plan's: ``autotune.plan``)."""

    model: str
    model_path: str | None = None
    methods: tuple[str, ...] | None = None  # None: every registered method that applies
    prompts: str | None = None
    out: Path | None = None
    storage: str | None = None
    trials: int | None = None
    time_budget_s: float | None = None  # per method, for its searches
    heads: dict[str, str] = field(default_factory=dict)  # method -> head folder
    search_spaces: dict[str, str] = field(default_factory=dict)  # entry -> YAML file
    heldback_prompts: int = plan.HELDBACK_PROMPTS
    max_new_tokens: int = plan.HELDBACK_TOKENS
    select_prompts: int = plan.SELECT_PROMPTS
    margin: float = plan.MARGIN
    workers: Workers = field(default_factory=Workers)
    dtype: str = "auto"  # auto, float32, bfloat16, float16 (autotune.hardware)
    device: str = "auto"  # auto, cpu, cuda, cuda:N
    budget_s: float | None = plan.BUDGET_S  # the whole run (``--budget``)
    # when the command started (``time.monotonic``; None: when the run starts): --budget
    # counts from there
    started: float | None = None
    train_heads: bool = True  # train missing heads within the run, when the model allows
    threads: int | None = None  # --threads (None: the cores, or one on a busy machine)
    # --engine (repeatable): deploying to these; the search keeps to what they express
    engines: tuple[str, ...] | None = None
    # --concurrency: the levels measured under load after the verdict, as the budget
    # allows (an empty tuple: none)
    concurrency: tuple[int, ...] = LEVELS


@dataclass(frozen=True)
class Measuring:
    """How the run measures, from the request: the bar a method must clear, the decoding
    length, the prompts of the race and of the held-back measurement, the load levels."""

    margin: float
    max_new_tokens: int
    select_prompts: int
    heldback_prompts: int
    concurrency: tuple[int, ...]

    @classmethod
    def of(cls, request: ProfileRequest) -> Measuring:
        return cls(**_fields_of(cls, request))


@dataclass(frozen=True)
class Tuning:
    """How the methods tune, from the request: where trials run, the user's caps, the
    engines deployed to, and the methods the user named (those are tuned whatever their
    bound; None: every method that applies)."""

    workers: Workers
    trials: int | None
    time_budget_s: float | None
    max_new_tokens: int
    engines: tuple[str, ...] | None
    margin: float
    methods: tuple[str, ...] | None

    @classmethod
    def of(cls, request: ProfileRequest) -> Tuning:
        return cls(**_fields_of(cls, request))

    @property
    def named(self) -> bool:
        return self.methods is not None


def _fields_of(cls: type, request: ProfileRequest) -> dict:
    """The request's values of the fields of ``cls`` (a part of the request)."""
    return {f.name: getattr(request, f.name) for f in dataclasses.fields(cls)}


def default_out(model_name: str) -> Path:
    return Path("profiles") / f"{model_name}.yaml"


def parse_methods(text: str) -> tuple[str, ...]:
    """``--methods``: registered names (any spelling ``registry.normalise`` takes)."""
    names = tuple(registry.get(m).name for m in text.split(",") if m.strip())
    if not names:
        raise AutotuneError(f"no method named: choose from {', '.join(registry.names())}")
    return tuple(dict.fromkeys(names))
