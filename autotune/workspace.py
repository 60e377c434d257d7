"""What every command works on: the target, its prompts, the device, the study database."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from autotune import engine, hardware
from autotune.budget import Budget
from autotune.engine.runner import Runner
from autotune.errors import PromptsFileError
from autotune.measure.costs import LatencyCurve, SublayerCosts
from autotune.measure.roofline import (
    Roofline,
    linear_params,
    measure_roofline,
    verify_record,
    weight_bytes,
)
from autotune.measure.timing import EncodedPrompt
from autotune.models.loading import Target
from autotune.models.ref import TargetRef
from autotune.progress import say, step
from autotune.prompts import Prompt, default_prompts_path, load_prompts, split_prompts
from autotune.studies.database import storage_url
from autotune.studies.storage import MeasurementCache


@dataclass
class Workspace:
    ref: TargetRef
    target: Target
    runner: Runner
    prompts_path: Path
    prompts: list[Prompt]
    storage: str
    hardware: dict = field(default_factory=dict)
    _cache: MeasurementCache | None = None
    # False once a profile's answers phase decoded what its time allowed: the tuners then
    # calibrate on those answers, decoding at most enough for CALIBRATION_LEAST prompts
    decode_missing: bool = True
    # the run's deadline: re-measurements of a timing stop at it (None: no deadline)
    deadline: Budget | None = None
    # what this run measured or checked already: not checked again (each check times)
    _this_run: dict[tuple[str, str, str], Any] = field(default_factory=dict)

    @classmethod
    def open(
        cls,
        ref: TargetRef,
        prompts: str | Path | None,
        storage: str | None,
        need_storage: bool = True,
    ) -> Workspace:
        from autotune.models import resolve_model

        # Cheap checks first, so that bad input fails before any long work or any write.
        path = Path(prompts) if prompts else default_prompts_path()
        loaded = load_prompts(path)
        resolve_model(ref.spec, ref.model_path)
        url = storage_url(storage)
        cache = MeasurementCache(url) if need_storage else None
        target = ref.load()
        return cls(
            ref=ref,
            target=target,
            runner=ref.runner(),
            prompts_path=path,
            prompts=loaded,
            storage=url,
            hardware=hardware.describe(ref.device),
            _cache=cache,
        )

    def search_prompts(self) -> list[Prompt]:
        """Where every choice is made."""
        return split_prompts(self.prompts)[0]

    def heldback_prompts(self) -> list[Prompt]:
        """Measured once, for the final choices: the figures reported."""
        return split_prompts(self.prompts)[1]

    def check_context(self, answer_tokens: int) -> None:
        """Every prompt leaves room for its answer (and a draft) in the model's context:
        one that does not is refused here, by name and by how much, rather than decoded
        at positions the model was never trained on."""
        context = getattr(self.target.model.config, "max_position_embeddings", None)
        if not context:
            return
        room = context - answer_tokens - DRAFT_ROOM
        for prompt in self.prompts:
            if len(prompt.text) < room:  # a token is at least one character
                continue
            length = _quiet_length(self.target, prompt.text)
            if length > room:
                raise PromptsFileError(
                    f"{self.prompts_path}: prompt '{prompt.id}' is {length} tokens, "
                    f"{length - room} more than this model's context leaves for a prompt "
                    f"({context} tokens less {answer_tokens + DRAFT_ROOM} for the answer and "
                    "its drafts): shorten it or leave it out of the prompts file"
                )

    def encode(self, prompts: list[Prompt]) -> list[EncodedPrompt]:
        return [EncodedPrompt(p.id, self.target.encode_chat(p.text), p.category) for p in prompts]

    def device_key(self) -> str:
        """What a cached timing is valid for: this device, threads, dtype, torch, and the
        engine's revision (a faster engine's timings replace a slower one's)."""
        return f"{hardware.key(self.hardware, self.target.dtype)}|engine {engine.REVISION}"

    # Measurements reused between runs: same model, same inputs, and for timings the same
    # device, threads, dtype and torch; each is labelled with where and when it was taken.
    def cached_measurement(
        self,
        kind: str,
        key: str,
        build: Callable[[], Any],
        device_bound: bool = True,
        spot_check: Callable[[Any], float] | None = None,
    ) -> Any:
        """``build()``'s value, or the one cached for these inputs. ``spot_check(value)``
        (timings) measures one point again and returns how far off the cached value is
        (relative): past ``SPOT_CHECK_TOLERANCE`` the cache is dropped and rebuilt."""
        hw = self.device_key() if device_bound else "any"
        if (kind, key, hw) in self._this_run:
            return self._this_run[kind, key, hw]
        if self._cache is not None:
            hit = self._cache.get(kind, self.target.fingerprint, hw, key)
            value = _cached_value(hit, labelled=device_bound)
            if value is not None and self._still_holds(kind, value, spot_check):
                say(
                    f"[dim]reusing {kind} measured earlier for this model"
                    f"{' on this device' if device_bound else ''}[/dim]"
                )
                self._this_run[kind, key, hw] = value
                return value
        value = build()
        self._this_run[kind, key, hw] = value
        if self._cache is not None:
            label = {
                "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
                "machine": self.hardware,
                "dtype": self.target.dtype,
            }
            self._cache.put(
                kind, self.target.fingerprint, hw, key, {"value": value, "label": label}
            )
        return value

    def _still_holds(self, kind: str, value: Any, spot_check) -> bool:
        if spot_check is None:
            return True
        off = spot_check(value)
        if abs(off) <= SPOT_CHECK_TOLERANCE:
            return True
        say(
            f"[yellow]the {kind} cached for this machine is off by {off:+.0%} now (checked "
            f"at one point): measuring it again[/yellow]"
        )
        return False

    def forward_seconds_now(self, repeats: int = 5) -> float:
        """One single-token forward after the curves' context, timed now (median)."""
        from autotune.measure.costs import time_one_forward

        return time_one_forward(self.runner, repeats)

    def continuations(self, prompts: list[EncodedPrompt], tokens: int):
        """The target's greedy continuations: what a drafter must predict. They are the
        model's shared self-distillation answers (``training.distill.AnswerCache``): the
        ones missing are decoded in batches, once for every method and head trainer (only
        up to ``CALIBRATION_LEAST`` prompts when ``decode_missing`` is off)."""
        from autotune.training.distill import GENERATION_BATCH, decode_to_cache
        from autotune.training.job import answer_cache

        continuations = decode_to_cache(
            self.runner,
            [p.ids for p in prompts],
            tokens,
            GENERATION_BATCH,
            answer_cache(self.target.fingerprint),
            say_reused=True,
            least=None if self.decode_missing else CALIBRATION_LEAST,
        )
        answered = sum(1 for cont in continuations if cont)
        if not self.decode_missing and answered < len(prompts):
            say(
                f"[dim]calibrating on {answered} of {len(prompts)} prompts: those the answers "
                "phase decoded in its time[/dim]"
            )
        return [(p.ids, cont) for p, cont in zip(prompts, continuations) if len(cont) > 1]

    def device_costs(self, max_tokens: int = 16) -> tuple[LatencyCurve, SublayerCosts]:
        from autotune.measure.costs import measure_sublayer_costs

        def build():
            with step("latency: sublayer costs", 1):
                return measure_sublayer_costs(self.runner).__dict__

        costs = self.cached_measurement(
            "latency",
            "sublayer costs",
            build,
            spot_check=lambda d: self._off(SublayerCosts(**d).forward_seconds()),
        )
        return self.verify_curve(max_tokens), SublayerCosts(**costs)

    def verify_curve(self, max_tokens: int, repeats: int = 5) -> LatencyCurve:
        """One target forward over n = 1..max_tokens new tokens (tree verification). One
        sparse curve, as long as the longest any method asks for, serves them all."""
        from autotune.measure.costs import measure_verify_curve

        size = max(max_tokens, SHARED_CURVE_TOKENS)

        def build():
            with step(f"latency: verify curve n = 1..{size}", repeats + 1) as advance:
                return measure_verify_curve(
                    self.runner,
                    size,
                    repeats,
                    progress=advance,
                    say=say,
                    sparse=True,
                    until=self.deadline,
                ).seconds

        seconds = self.cached_measurement(
            "latency",
            f"verify curve grid <= {size} x{repeats}",
            build,
            spot_check=lambda seconds: self._off(seconds[0]),
        )
        return LatencyCurve(seconds[:max_tokens])

    def roofline(self) -> Roofline:
        """This machine's floor for the target (``measure.roofline``): its bandwidth and
        GEMM peak measured once (quick sizes, ~0.3 s on 2 cores) and cached like the
        curves; the weights counted now."""

        def build():
            with step("latency: memory bandwidth and GEMM peak", 1) as advance:
                measured = measure_roofline(self.runner, quick=True)
                advance()
            return {"bandwidth": measured.bandwidth, "gemm_peak": measured.gemm_peak}

        machine = self.cached_measurement("latency", "roofline quick", build)
        return Roofline(
            **machine, weight_bytes=weight_bytes(self.runner), params=linear_params(self.runner)
        )

    def verify_record(self, curve: LatencyCurve) -> dict:
        """What a method's profile block records of the verify curve it was tuned on."""
        return verify_record(curve, self.roofline())

    def _off(self, cached_seconds: float) -> float:
        return self.forward_seconds_now() / max(cached_seconds, 1e-12) - 1.0


# A cached timing whose spot check is off by more than this is measured again.
SPOT_CHECK_TOLERANCE = 0.15


def _quiet_length(target: Target, text: str) -> int:
    """Tokens of ``text`` as a chat turn, without the tokenizer's own warning about long
    inputs (the refusal that follows says it in autotune's words)."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        return len(target.encode_chat(text))
    finally:
        hf_logging.set_verbosity(level)


# Positions a decoding may add past its answer: the largest tree or draft verified at once.
DRAFT_ROOM = 64

# Tuners calibrate on at least this many prompts' continuations, decoding them if need be.
CALIBRATION_LEAST = 8
# The verify curve's length when no method asks for more (Medusa's largest tree, 128).
SHARED_CURVE_TOKENS = 128


def _cached_value(hit: Any, labelled: bool) -> Any:
    """The value of a cache entry; None for none, and for an unlabelled timing (written by
    an autotune that did not record where it was measured: not trusted)."""
    if isinstance(hit, dict) and set(hit) == {"value", "label"}:
        return hit["value"]
    return None if labelled else hit
