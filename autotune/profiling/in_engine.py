"""The llama.cpp candidates measured in llama-server itself (``profile --engine
llamacpp``), and the llama.cpp verdict made from that measurement.

Autotune's engine prices a verify pass by its own kernels and checks lossless against its
own greedy decoding; llama.cpp prices it by its own (quantized weights, its own batching)
and its batched products need not equal its one-row products, so a setting faster and
lossless in autotune may be slower, or change the output, in llama-server. Where the user
deploys to llama.cpp and llama-server is built here, each tuned method's llama.cpp export
decodes the held-back prompts in llama-server beside its greedy decoding, interleaved
(``verify.side_by_side``, as ``autotune verify`` does), every output checked against
that greedy output. A setting that is not lossless there, or not clearly faster than
that greedy decoding, is not recommended for llama.cpp, and the verdict says why.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

from autotune.budget import Budget
from autotune.errors import AutotuneError
from autotune.measure import ties
from autotune.measure.timing import EncodedPrompt, Measurement, interval_text
from autotune.profile.blocks import EngineFigures, EngineVerdict, HardwareInfo, MethodSettings
from autotune.profiling import state
from autotune.profiling.heldback import heldback
from autotune.profiling.report import MEASURE_IN_LLAMACPP, model_info
from autotune.profiling.request import Measuring
from autotune.profiling.state import RunState
from autotune.progress import say, step
from autotune.serving import Decoded, llamacpp

ENGINE = "llamacpp"
PHASE = "in serving engine (held back)"
# Decoders the phase runs: the engine's greedy decoding and (about) one candidate.
DECODERS = 2
GREEDY = "llama-server greedy"


def where() -> str:
    """Where the figures of this module are measured: "llama-server 0c1e57098"."""
    return f"llama-server {llamacpp.COMMIT}"


def wanted(run: RunState) -> bool:
    """Whether the user deploys to llama.cpp (``--engine llamacpp``)."""
    return ENGINE in (run.tuning.engines or ())


def planned(run: RunState) -> RunState:
    """The run with this phase's time in its plan, where it will run."""
    if not (wanted(run) and llamacpp.built()):
        return run
    facts = dataclasses.replace(run.facts, engine_decoders=DECODERS)
    return dataclasses.replace(run, facts=facts)


def in_llama_server(
    run: RunState, tuned: dict[str, MethodSettings], measuring: Measuring
) -> tuple[RunState, dict[str, MethodSettings], EngineVerdict | None]:
    """The tuned methods' llama.cpp exports measured in llama-server (the figures added to
    their ``engines.llamacpp``) and the llama.cpp verdict; where it cannot be measured
    here, the blocks as they were, no verdict, and one line saying so."""
    if not wanted(run):
        return run, tuned, None
    if not llamacpp.built():
        say(
            "[yellow]the llama.cpp figures are autotune's engine's estimate, drafting by "
            f"llama.cpp's rule; measure them in llama-server: {MEASURE_IN_LLAMACPP}[/yellow]"
        )
        return run, tuned, None
    gguf = _gguf(run)
    flags = candidates(run, tuned)
    if gguf is None or not flags:
        return run, tuned, None
    run, figures = measure(run, gguf, flags, measuring)
    if not figures:
        return run, tuned, None
    bound = 1.0 + measuring.margin
    blocks = dict(tuned)
    for name, measured in figures.items():
        judged = measured.model_copy(update={"not_recommended": why_not(measured, bound)})
        variant = blocks[name].engines[ENGINE].model_copy(update={"in_engine": judged})
        engines = {**blocks[name].engines, ENGINE: variant}
        blocks[name] = blocks[name].model_copy(update={"engines": engines})
    return run, blocks, engine_verdict(figures, measuring.margin)


def _gguf(run: RunState) -> Path | None:
    """The target as llama.cpp loads it, where it is a GGUF file (else said: None)."""
    from autotune.models import resolve_model

    resolved = resolve_model(run.ws.ref.spec, run.ws.ref.model_path)
    if resolved.kind == "gguf":
        return Path(resolved.path)
    say(
        f"[yellow]llama.cpp runs GGUF files and the model is {resolved.path}: its figures "
        "are autotune's engine's estimate; measure them with `autotune verify PROFILE "
        "--engine llamacpp --gguf FILE.gguf`[/yellow]"
    )
    return None


def candidates(run: RunState, tuned: dict[str, MethodSettings]) -> dict[str, list[str]]:
    """Each tuned method with a llama.cpp setting of its own: its export's llama-server
    flags (one that drafts with a draft model of the user's is said and left out)."""
    from autotune.export.base import Deployment
    from autotune.methods import registry

    out = {}
    for name, settings in tuned.items():
        method = registry.method(name)
        exporter = method.exporters.get(ENGINE)
        if exporter is None or ENGINE not in settings.engines:
            continue
        served = method.for_engine(settings, ENGINE)
        hardware = HardwareInfo(**run.ws.hardware)
        deployment = Deployment(name, served, model_info(run.ws), hardware)
        flags = llamacpp.flags_of(exporter.render(deployment).text)
        if llamacpp.needs_draft_model(flags):
            say(f"{name} drafts in llama.cpp with a draft model of yours: not measured there")
            continue
        out[name] = flags
    return out


@state.phase(lambda run, gguf, flags, measuring: PHASE)
def measure(
    run: RunState,
    budget: Budget,
    gguf: Path,
    flags: dict[str, list[str]],
    measuring: Measuring,
) -> tuple[RunState, dict[str, EngineFigures], str]:
    """Each candidate's flags against llama-server's greedy decoding, on the held-back
    prompts, in this phase's time (at least two prompts); a server that fails is said,
    and nothing is measured then."""
    from autotune.verify import side_by_side

    prompts = heldback(run.ws, measuring)
    firsts: dict[str, str] = {}

    def seen(prompt: EncodedPrompt, decoded: dict[str, Decoded]) -> None:
        for name in flags:
            if name not in firsts:
                found = first_difference(decoded[GREEDY].tokens, decoded[name].tokens)
                if found is not None:
                    number = prompts.index(prompt) + 1
                    firsts[name] = f"token {found} of held-back prompt {number} ({prompt.id})"

    label = f"in {where()}: {', '.join(flags)} against its greedy decoding"
    try:
        with (
            llamacpp.servers(gguf, {GREEDY: [], **flags}) as running,
            step(label, len(prompts)) as advance,
        ):
            decoders = {name: server.decode for name, server in running.items()}
            measured = side_by_side(
                decoders, prompts, measuring.max_new_tokens, advance, budget, seen
            )
    except AutotuneError as error:
        say(f"[yellow]not measured in {where()}: {error}[/yellow]")
        return run, {}, f"nothing: {error}"
    figures = {
        name: figures_of(m, " ".join(flags[name]), firsts.get(name))
        for name, m in measured.items()
        if m.prompts
    }
    counted = max((f.prompts for f in figures.values()), default=0)
    return run, figures, f"{', '.join(figures) or 'nothing'} on {counted} prompts"


def first_difference(greedy: list[int], tokens: list[int]) -> int | None:
    """The first new token (counted from 1) where ``tokens`` leave ``greedy``; None where
    they are equal."""
    at = ties.first_difference(tokens, greedy)
    return None if at is None else at + 1


def figures_of(measurement: Measurement, flags: str, first: str | None) -> EngineFigures:
    return EngineFigures(
        **measurement.summary(with_categories=False),
        measured_in=where(),
        release=llamacpp.release(),
        flags=flags,
        first_difference=first if measurement.lossless is False else None,
    )


# --- the verdict --------------------------------------------------------------------------


def why_not(figures: EngineFigures, bound: float) -> str | None:
    """Why a setting measured in the engine is not recommended there (None: it is)."""
    if figures.lossless is False:
        return (
            f"not lossless in {figures.measured_in} on this machine: its output differs "
            "from its own greedy output (its batched products differ from its one-row "
            f"products); first difference at {figures.first_difference or 'an unknown token'}"
        )
    low = figures.speedup_interval[0] if figures.speedup_interval else figures.speedup
    if low <= bound:
        return (
            f"not clearly faster than llama-server's greedy decoding in "
            f"{figures.measured_in}: {interval_text(figures.model_dump())} on "
            f"{figures.prompts} held-back prompts (the interval's low end must clear "
            f"{bound:.2f})"
        )
    return None


def engine_verdict(figures: Mapping[str, EngineFigures], margin: float) -> EngineVerdict:
    """The fastest setting that is lossless and clearly faster than the engine's greedy
    decoding (its interval's low end above 1 + ``margin``), else none, with why."""
    bound = 1.0 + margin
    measured_in = next(iter(figures.values())).measured_in
    judged = {name: why_not(f, bound) for name, f in figures.items()}
    winners = [name for name, why in judged.items() if why is None]
    if not winners:
        reason = "; ".join(f"{name} {why}" for name, why in judged.items())
        return EngineVerdict(recommended="none", reason=reason, measured_in=measured_in)
    best = max(winners, key=lambda name: figures[name].speedup)
    chosen = figures[best]
    reason = (
        f"{best} measured {interval_text(chosen.model_dump())} over llama-server's greedy "
        f"decoding in {measured_in}, lossless, on {chosen.prompts} held-back prompts"
    )
    return EngineVerdict(recommended=best, reason=reason, measured_in=measured_in)
