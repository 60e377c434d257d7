"""The profile assembled from the run's figures, and the lines that tell people what the
verdict table does not show."""

from __future__ import annotations

from pathlib import Path

from autotune.engine.sampling import GREEDY
from autotune.export.engines import ENGINES
from autotune.measure.load import requests_text
from autotune.measure.noise import NoiseRecord
from autotune.measure.timing import Measurement, interval_text
from autotune.methods import registry
from autotune.profile.blocks import (
    EngineVariant,
    Environment,
    Figures,
    HardwareInfo,
    Load,
    LoadLevel,
    Measured,
    MethodSettings,
    ModelInfo,
    Verdict,
    Workload,
    by_rule,
)
from autotune.profile.schema import ProfileBase, methods_block, profile_model
from autotune.profile.travel import file_sha256, hub_identity
from autotune.profiling.heldback import ENGINE_MARK, HeldBack, served_as_tuned
from autotune.profiling.request import Measuring
from autotune.schedule import clock
from autotune.workspace import Workspace

LOSSLESS_REFERENCE = (
    "plain greedy decoding by autotune's own runner (the same weights and "
    "kernels); see docs/profile.md for its parity with transformers' generate"
)
# How a llama.cpp figure of autotune's engine is measured in llama-server instead.
MEASURE_IN_LLAMACPP = (
    "`autotune engines build llamacpp`, then `autotune verify PROFILE --engine llamacpp`"
)
# A forward that got this much slower or faster between checks is said in the verdict.
SPEED_CHANGE_SAID = 1.5


def assemble(
    ws: Workspace,
    tuned: dict[str, MethodSettings],
    held: HeldBack,
    verdict: Verdict,
    noise: NoiseRecord,
    measuring: Measuring,
) -> ProfileBase:
    blocks = {  # a method the race dropped keeps its search-prompt figures only
        name: settings.model_copy(update={"measured": Measured(**held.measured[name].summary())})
        if name in held.measured
        else settings
        for name, settings in tuned.items()
    }
    blocks = with_engine_figures(blocks, held.measured)
    categories = sorted({p.category for p in ws.prompts if p.category})
    return profile_model()(
        model=model_info(ws),
        hardware=HardwareInfo(**ws.hardware),
        environment=Environment(noise=noise.as_dict()),
        workload=Workload(
            prompts=str(ws.prompts_path.resolve()),
            prompts_sha256=file_sha256(ws.prompts_path),
            num_prompts=len(ws.prompts),
            max_new_tokens=measuring.max_new_tokens,
            temperature=GREEDY.temperature,
            categories=categories or None,
            lossless_reference=LOSSLESS_REFERENCE,
        ),
        recommended=verdict.recommended,
        verdict=verdict,
        methods=methods_block(**blocks),
    )


def with_engine_figures(
    blocks: dict[str, MethodSettings], measured: dict[str, Measurement]
) -> dict[str, MethodSettings]:
    """The blocks with their engine settings' held-back figures (``method@engine,...``;
    an engine served the method's setting itself shares the method's)."""
    out = dict(blocks)
    for name, block in blocks.items():
        if name in measured and measured[name].prompts:
            own = {
                e: v.model_copy(update={"measured": block.measured, "measured_in": by_rule(e)})
                if served_as_tuned(block, v)
                else v
                for e, v in block.engines.items()
            }
            out[name] = block.model_copy(update={"engines": own})
    for key, measurement in measured.items():
        name, _, engines = key.partition(ENGINE_MARK)
        if not engines or not measurement.prompts or name not in out:
            continue
        figures = Measured(**measurement.summary())
        own = {
            e: v.model_copy(update={"measured": figures, "measured_in": by_rule(e)})
            if e in engines.split(",")
            else v
            for e, v in out[name].engines.items()
        }
        out[name] = out[name].model_copy(update={"engines": own})
    return out


def model_info(ws: Workspace) -> ModelInfo:
    """The target, named by what identifies it elsewhere (``profile.travel``) and where
    it is here."""
    cfg = ws.runner.config
    repo, revision = hub_identity(Path(ws.target.path))
    return ModelInfo(
        name=ws.target.name,
        path=str(ws.target.path),
        repo=repo,
        revision=revision,
        fingerprint=ws.target.fingerprint,
        architecture=ws.target.architecture,
        num_layers=ws.runner.num_layers,
        hidden_size=cfg.hidden_size,
        vocab_size=cfg.vocab_size,
        dtype=ws.target.dtype,
    )


# --- for people -----------------------------------------------------------------------


def verdict_lines(profile: ProfileBase) -> list[str]:
    """What the verdict table (``profile.report.verdict_table``) does not show: the
    expansions kept, each method's notes, a busy machine, then the recommendation."""
    lines = []
    for name, method in profile.method_blocks().items():
        lines += _expansion_lines(name, method)
        lines += [f"{name} note: {note}" for note in method.notes]
        lines += engine_lines(name, method)
        lines += load_lines(name, method.load)
    if profile.verdict is not None:
        lines += [f"{name} skipped: {why}" for name, why in profile.verdict.skipped.items()]
        lines += [
            f"{name} dropped from the selection race: {why}"
            for name, why in profile.verdict.dropped.items()
        ]
        lines += time_lines(profile.verdict.time)
    lines += _machine_lines(profile.environment.noise if profile.environment else {})
    verdict = profile.verdict
    reason = f" ({verdict.reason})" if verdict is not None else ""
    lines.append(f"recommended: {profile.recommended}{reason}")
    return lines


def _expansion_lines(name: str, method: MethodSettings) -> list[str]:
    """Each expansion a measured method keeps, described (CAPE: its bins)."""
    if method.measured is None:
        return []
    lines = []
    for expansion in registry.expansions().values():
        block = expansion.block(method)
        if block is not None and block.enabled:
            lines.append(f"{name} keeps {expansion.name}: {expansion.describe(block)}")
    return lines


def _machine_lines(noise: dict) -> list[str]:
    """A busy machine, or one whose speed changed during the run, said."""
    lines = []
    if noise.get("busy"):
        lines.append(f"the machine was busy while timing: {'; '.join(noise['reasons'])}")
    low, high = noise.get("forward_ms_range") or (0.0, 0.0)
    if low and high / low > SPEED_CHANGE_SAID:
        lines.append(
            f"the machine's speed changed {high / low:.1f}x during the run (one forward "
            f"{low:.0f}-{high:.0f} ms): timing is interleaved, so the ratios hold, but "
            "fewer prompts fitted in the time"
        )
    return lines


def load_lines(name: str, load: Load | None) -> list[str]:
    """Speedup against concurrency: per level, the setting chosen and its held-back
    throughput speedup, beside the tuned setting's; the crossover."""
    if load is None:
        return []
    lines = [_level_line(name, level) for level in load.levels]
    if load.crossover:
        lines.append(f"{name}: speculation off from {requests_text(load.crossover)} in flight")
    elif load.levels:
        # the schedule is chosen on search rounds; a level's few held-back rounds may not
        # prove it, and the line says which do
        unproven = [lv.concurrency for lv in load.levels if not _proven(lv)]
        if not unproven:
            lines.append(f"{name}: speculation pays at every concurrency measured")
        else:
            levels = ", ".join(str(c) for c in unproven)
            lines.append(
                f"{name}: speculation kept at every concurrency measured (chosen on search "
                f"rounds); held back, its interval includes 1.0 at {levels} in flight: "
                "not proven faster there"
            )
    return lines


def _level_line(name: str, level: LoadLevel) -> str:
    chosen = (
        "off (plain decoding)"
        if level.setting == "off"
        else f"{level.setting}: {interval_text(level.model_dump())}"
    )
    tuned = f"{level.tuned_speedup:.3f}x" if level.tuned_speedup is not None else "-"
    return (
        f"{name} with {requests_text(level.concurrency)} in flight: {chosen} "
        f"({level.tokens_per_s:.1f} vs {level.baseline_tokens_per_s:.1f} tokens/s; the "
        f"tuned setting {tuned}; {level.rounds} rounds held back)"
    )


def _proven(level: LoadLevel) -> bool:
    """Held back, the level's interval lies above plain decoding (off needs no proof)."""
    if level.setting == "off":
        return True
    interval = level.speedup_interval
    return interval is not None and interval[0] > 1.0


def engine_lines(name: str, method: MethodSettings) -> list[str]:
    """The method as each engine serves it (its own rule and options): the figures the
    export to that engine carries, each with where it was measured; where the engine
    itself measured it, that figure and whether it is recommended there."""
    lines = []
    for engine, variant in method.engines.items():
        figures: Figures | None = variant.measured
        where = "held back"
        if figures is None:
            figures, where = variant.selection, "search prompts"
        if figures is None:
            said = "unmeasured" + (
                f" (the proxy predicted {variant.predicted:.3f}x)" if variant.predicted else ""
            )
        else:
            measured_in = variant.measured_in or by_rule(engine)
            said = (
                f"{interval_text(figures.model_dump())} on {figures.prompts} {where}, "
                f"in {measured_in}"
            )
        title = ENGINES.get(engine, engine)
        lines.append(f"{name} for {title}: {variant.description}: {said}")
        lines += in_engine_lines(name, engine, variant)
    return lines


def in_engine_lines(name: str, engine: str, variant: EngineVariant) -> list[str]:
    """The setting measured in the engine itself, and what that decides; for llama.cpp
    without it, how to measure it there."""
    measured = variant.in_engine
    if measured is None:
        if engine != "llamacpp" or variant.served is not None:
            return []
        return [
            f"{name} for llama.cpp: the figure above is autotune's engine's estimate; "
            f"measure it in llama-server: {MEASURE_IN_LLAMACPP}"
        ]
    lossless = "lossless" if measured.lossless else "NOT lossless"
    if measured.first_difference:
        lossless += f" (first difference at {measured.first_difference})"
    why = measured.not_recommended
    judged = f"not recommended for {ENGINES[engine]}: {why}" if why else "faster there"
    return [
        f"{name} in {measured.measured_in}: {measured.flags}: "
        f"{interval_text(measured.model_dump())} on {measured.prompts} held back against its "
        f"greedy decoding, {lossless}; {judged}"
    ]


def time_lines(rows: list[dict]) -> list[str]:
    """Where the run's time went: one line per phase, planned against spent (m:s)."""
    if not rows:
        return []
    planned = sum(r.get("planned_s", 0.0) for r in rows)
    spent = sum(r.get("spent_s", 0.0) for r in rows)
    lines = [f"time: {clock(spent)} spent in {len(rows)} phases (planned {clock(planned)})"]
    lines += [
        f"  {r['phase']:<30} planned {clock(r.get('planned_s', 0.0)):>6}  spent "
        f"{clock(r.get('spent_s', 0.0)):>6}  {r.get('bought', '')}"
        + (f"  [busy: {r['busy']}]" if r.get("busy") else "")
        for r in rows
    ]
    return lines
