"""`autotune verify PROFILE --engine E`: the profile's export measured in the serving engine
it is for, as a user deploys it.

On the profile's held-back prompts, one at a time and interleaved (the order rotating from
prompt to prompt, so that a slow spell of the machine hits every variant alike), the
engine decodes greedily three ways: with no speculation, with its own default speculative
setting, and with autotune's export. Each speedup is over that engine's own greedy
decoding, with a paired-bootstrap interval over prompts, and every output is checked
token for token against that greedy output. The figures are recorded in the profile's
method block (``verified``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.budget import Budget
from autotune.errors import AutotuneError
from autotune.export.engines import VERIFIABLE
from autotune.measure.timing import MIN_PROMPTS, EncodedPrompt, Measurement
from autotune.profile.blocks import EngineLoad, EngineLoadLevel, Verified
from autotune.serving import Decoded, paired
from autotune.serving.tuning import InEngine

ENGINES = VERIFIABLE
GREEDY, DEFAULT, EXPORT = "no speculation", "engine default", "autotune export"

# A variant decodes a prompt's token ids for at most this many new tokens.
Decode = Callable[[list[int], int], Decoded]


@dataclass
class Report:
    """An engine's side by side: each speculative variant against its greedy decoding."""

    engine: str
    release: str
    method: str
    default: str  # what the engine's own default is, in its words
    max_new_tokens: int
    variants: dict[str, Measurement]  # DEFAULT and EXPORT, each against GREEDY
    tuned: InEngine | None = None  # the export's setting, tuned in the engine (--tune)

    def over_default(self) -> float:
        return self.variants[EXPORT].speedup / max(self.variants[DEFAULT].speedup, 1e-9)

    def summary(self) -> dict:
        return {
            "engine": self.engine,
            "release": self.release,
            "method": self.method,
            "default": self.default,
            "max_new_tokens": self.max_new_tokens,
            "over_default": round(self.over_default(), 4),
            "variants": {name: m.summary() for name, m in self.variants.items()},
        }

    def record(self) -> Verified:
        export, default = self.variants[EXPORT], self.variants[DEFAULT]
        return Verified(
            engine=self.engine,
            release=self.release,
            speedup=round(export.speedup, 4),
            speedup_interval=export.interval().as_list(),
            default=self.default,
            default_speedup=round(default.speedup, 4),
            over_default=round(self.over_default(), 4),
            lossless=export.lossless,
            prompts=len(export.prompts),
            max_new_tokens=self.max_new_tokens,
        )


def side_by_side(
    variants: dict[str, Decode],
    prompts: list[EncodedPrompt],
    max_new_tokens: int,
    on_prompt: Callable[[], None] | None = None,
    until: Budget | None = None,
    seen: Callable[[EncodedPrompt, dict[str, Decoded]], None] | None = None,
) -> dict[str, Measurement]:
    """Every variant but the first (the engine's greedy decoding) against the first, per
    prompt, in an order that rotates; a warm-up prompt first, not counted. ``until``:
    stop once it is spent (after ``MIN_PROMPTS`` prompts); ``seen``: given each prompt's
    decodings, by variant."""
    names = list(variants)
    if prompts:
        for name in names:
            variants[name](prompts[0].ids, min(max_new_tokens, 8))
    out = {name: Measurement() for name in names[1:]}
    for index, prompt in enumerate(prompts):
        if until is not None and until.spent() and index >= MIN_PROMPTS:
            break
        shift = index % len(names)
        decoded = {
            n: variants[n](prompt.ids, max_new_tokens) for n in names[shift:] + names[:shift]
        }
        greedy = decoded[names[0]]
        for name in names[1:]:
            out[name].prompts.append(paired(prompt, greedy, decoded[name]))
        if seen is not None:
            seen(prompt, decoded)
        if on_prompt is not None:
            on_prompt()
    return out


def verify(
    profile_path: Path,
    engine: str,
    limit: int | None = None,
    max_new_tokens: int | None = None,
    gguf: Path | None = None,
    record: bool = True,
    draft_gguf: Path | None = None,
    tune_s: float | None = None,
    storage: str | None = None,
) -> Report:
    """Measure the profile's recommended method, as exported for ``engine``, in it.
    ``tune_s``: first tune its n-gram setting in the engine itself for that long
    (``serving.tuning``), on search prompts, and measure that one."""
    from autotune.export import export_profile
    from autotune.profile.io import read_profile, write_profile
    from autotune.progress import step

    if engine not in ENGINES:
        raise AutotuneError(
            f"verify runs {', '.join(ENGINES)}; {engine} is not runnable here (its exports "
            "are checked against its pinned release's options instead)"
        )
    profile = read_profile(profile_path)
    export = export_profile(profile, engine, force=True)
    if tune_s is not None and (engine != "llamacpp" or export.method != "ngram"):
        raise AutotuneError(
            f"--tune tunes n-gram drafting in llama.cpp; the profile exports {export.method} "
            f"to {engine}: drop --tune, or verify an n-gram profile with --engine llamacpp"
        )
    tokens = max_new_tokens or profile.workload.max_new_tokens
    ws = _workspace(profile)
    ws.check_context(tokens)
    prompts = ws.encode(ws.heldback_prompts())[:limit]
    if not prompts:
        raise AutotuneError("the profile's workload has no held-back prompts to verify on")
    _proven_first(engine)
    tuned = None
    if tune_s is not None:
        tuned = _tune(profile, export.method, ws, tokens, gguf, tune_s, storage)
        export = export_profile(profile, engine, force=True)  # the setting tuned there
    with step(f"verify in {engine}: three ways each prompt", len(prompts)) as advance:
        if engine == "llamacpp":
            report = _llamacpp(profile, export, prompts, tokens, gguf, draft_gguf, advance)
        else:
            report = _hf(ws, export, prompts, tokens, advance)
    report.tuned = tuned
    if record:
        block = profile.block(export.method)
        kept = [v for v in block.verified if v.engine != engine]
        block.verified = [*kept, report.record()]
        write_profile(profile, profile_path)
    return report


def _proven_first(engine: str) -> None:
    """llama.cpp's build, proven before anything is measured where it has no proof yet."""
    if engine == "llamacpp":
        from autotune.serving.llamacpp import require_proven

        require_proven()


def _tune(profile, method, ws, tokens, gguf, seconds, storage):
    """The engine's own n-gram setting tuned in it, written into the profile's block (in
    memory: ``verify`` records it with the figures)."""
    from autotune.budget import Budget
    from autotune.drafters.engine_lookup import EngineLookupConfig
    from autotune.methods.ngram.settings import block_of, describe
    from autotune.profile.blocks import EngineVariant, Figures
    from autotune.progress import step
    from autotune.serving.tuning import GRID, tune_ngram
    from autotune.studies.storage import open_storage

    search = ws.encode(ws.search_prompts())
    trials = len(GRID)
    with step("tune in llama.cpp: ngram-simple settings on search prompts", trials) as advance:
        found = tune_ngram(
            _gguf(profile, gguf), search, tokens, open_storage(storage), Budget(seconds), advance
        )
    config = EngineLookupConfig("llamacpp", found.size_n, found.size_n, found.size_m)
    block = profile.block(method)
    block.engines = {
        **block.engines,
        "llamacpp": EngineVariant(
            setting=block_of(config).model_dump(),
            description=describe(config),
            tuned_in=found.release,
            served=Figures(**found.measurement.summary(False)),
        ),
    }
    return found


def _gguf(profile, gguf: Path | None) -> Path:
    """The model as llama.cpp loads it: ``gguf``, else the profile's model if a GGUF."""
    from autotune.bench import find_model
    from autotune.models import resolve_model

    if gguf is not None:
        return gguf
    resolved = resolve_model(find_model(profile.model))
    if resolved.kind != "gguf":
        raise AutotuneError(
            f"llama.cpp runs GGUF files and the profile's model is {resolved.path}: "
            "pass --gguf FILE.gguf (the same model, converted)"
        )
    return Path(resolved.path)


def _workspace(profile) -> Any:
    from autotune.bench import find_model, workload_prompts
    from autotune.models.ref import TargetRef
    from autotune.workspace import Workspace

    ref = TargetRef.for_user(find_model(profile.model), None, profile.model.dtype, "cpu")
    return Workspace.open(
        ref, workload_prompts(profile.workload.prompts), storage=None, need_storage=False
    )


def _llamacpp(profile, export, prompts, tokens, gguf, draft_gguf, advance) -> Report:
    from autotune.serving import llamacpp

    gguf = _gguf(profile, gguf)
    exported = _exported_flags(export, draft_gguf)
    flags = {GREEDY: [], DEFAULT: list(llamacpp.OWN_DEFAULT), EXPORT: exported}
    with llamacpp.servers(Path(gguf), flags) as running:
        decoders: dict[str, Decode] = {name: server.decode for name, server in running.items()}
        variants = side_by_side(decoders, prompts, tokens, advance)
    return Report(
        engine="llamacpp",
        release=llamacpp.release(),
        method=export.method,
        default=" ".join(llamacpp.OWN_DEFAULT),
        max_new_tokens=tokens,
        variants=variants,
    )


def _hf(ws, export, prompts, tokens, advance) -> Report:
    from autotune.serving import hf

    settings = {
        GREEDY: {},
        DEFAULT: dict(hf.OWN_DEFAULT),
        EXPORT: json.loads(export.text),  # as its note says: generate(ids, **settings)
    }
    decoders: dict[str, Decode] = {
        name: hf.decoder(ws.target.model, keys) for name, keys in settings.items()
    }
    return Report(
        engine="hf",
        release=hf.release(),
        method=export.method,
        default=", ".join(f"{k}={v}" for k, v in hf.OWN_DEFAULT.items()),
        max_new_tokens=tokens,
        variants=side_by_side(decoders, prompts, tokens, advance),
    )


def report_lines(report: Report) -> list[str]:
    """The side by side for people."""
    from autotune.measure.timing import interval_text

    any_variant = next(iter(report.variants.values()))
    lines = [
        f"{report.method} in {report.release}, {len(any_variant.prompts)} held-back prompts, "
        f"{report.max_new_tokens} tokens each, against the engine's own greedy decoding:"
    ]
    for name, m in report.variants.items():
        label = f"{name} ({report.default})" if name == DEFAULT else name
        # where the engine says what it drafted: how many tokens a step it gained
        drafted = f"  {m.tokens_per_step:.2f} tokens/step" if m._total("drafted") else ""
        lines.append(f"  {label:<44} {interval_text(m)}{drafted}  lossless {m.lossless}")
    lines.append(f"autotune export / engine default: {report.over_default():.3f}x")
    tuned = report.tuned
    if tuned is not None:
        lines.insert(
            0,
            f"tuned in {tuned.release}: {tuned.trials} ngram-simple settings tried on "
            f"{len(tuned.measurement.prompts)} search prompts; fastest n={tuned.size_n} "
            f"m={tuned.size_m}: {interval_text(tuned.measurement)}",
        )
        if not tuned.pays:
            lines.append(
                "no ngram-simple setting was clearly faster than llama.cpp's greedy decoding "
                "on the search prompts: serve this model in llama.cpp without speculation"
            )
    return lines


def verify_load(
    profile_path: Path,
    levels: tuple[int, ...],
    rounds: int,
    limit: int | None = None,
    max_new_tokens: int | None = None,
    gguf: Path | None = None,
    record: bool = True,
    draft_gguf: Path | None = None,
) -> EngineLoad:
    """The profile's llama.cpp export in llama-server with ``max(levels)`` slots, at each
    level as many concurrent requests, against the same server without speculation,
    rounds alternating (``measure.load``); recorded under the block's ``load.engines``."""
    from autotune.export import export_profile
    from autotune.measure.load import OFF, crossover
    from autotune.measure.timing import categories_in_turn
    from autotune.profile.io import read_profile
    from autotune.serving import llamacpp

    profile = read_profile(profile_path)
    export = export_profile(profile, "llamacpp", force=True)
    tokens = max_new_tokens or min(profile.workload.max_new_tokens, 64)
    ws = _workspace(profile)
    ws.check_context(tokens)
    encoded = ws.encode(ws.heldback_prompts())
    ids = [p.ids for p in categories_in_turn(encoded, limit or len(encoded))]
    if not ids:
        raise AutotuneError("the profile's workload has no held-back prompts to verify on")
    flags = _exported_flags(export, draft_gguf)
    llamacpp.require_proven()  # before anything is measured, where the build has no proof
    measured = _load_levels(_gguf(profile, gguf), flags, ids, tokens, levels, rounds)
    # faster by throughput alone: llama.cpp's own outputs change with the batch's shape
    # (its plain decoding too), so "lossless" is reported per level but does not decide
    schedule = {lv.concurrency: EXPORT if lv.speedup_interval[0] > 1.0 else OFF for lv in measured}
    result = EngineLoad(
        release=llamacpp.release(),
        setting=" ".join(flags),
        parallel=max(levels),
        levels=measured,
        crossover=crossover(schedule),
        max_new_tokens=tokens,
    )
    if record:
        _record_load(profile, profile_path, export.method, result)
    return result


def _load_levels(
    gguf: Path,
    flags: list[str],
    ids: list[list[int]],
    tokens: int,
    levels: tuple[int, ...],
    rounds: int,
) -> list[EngineLoadLevel]:
    """The export (``flags``) against plain decoding in llama-server with ``max(levels)``
    slots, at each level as many requests in flight, ``rounds`` rounds a level."""
    from autotune.measure.load import OFF, measure_level, requests_text
    from autotune.progress import step
    from autotune.serving import llamacpp
    from autotune.serving.load import concurrent_rounds

    measured = []
    with llamacpp.servers(Path(gguf), {OFF: [], EXPORT: flags}, parallel=max(levels)) as running:
        run_round = concurrent_rounds({n: s.decode for n, s in running.items()}, tokens)
        run_round(OFF, ids[:1], 1)  # warm-up, not counted
        run_round(EXPORT, ids[:1], 1)
        for concurrency in levels:
            label = f"verify in llama.cpp: {requests_text(concurrency)} in flight"
            with step(label, rounds) as advance:
                level = measure_level(
                    run_round, [EXPORT], ids, concurrency, rounds, on_round=lambda _: advance()
                )
            measured.append(
                EngineLoadLevel(
                    concurrency=concurrency,
                    rounds=level.rounds,
                    **level.figures[EXPORT].summary(),
                )
            )
    return measured


def _record_load(profile, profile_path: Path, method: str, result: EngineLoad) -> None:
    """``result`` under the method block's ``load.engines``, written to the profile."""
    from autotune.profile.blocks import Load
    from autotune.profile.io import write_profile

    block = profile.block(method)
    load = block.load or Load(max_new_tokens=result.max_new_tokens)
    block.load = load.model_copy(update={"engines": {**load.engines, "llamacpp": result}})
    write_profile(profile, profile_path)


def _exported_flags(export, draft_gguf: Path | None) -> list[str]:
    """The export's llama-server flags, with the user's draft model where it needs one."""
    from autotune.serving import llamacpp

    flags = llamacpp.flags_of(export.text)
    if llamacpp.needs_draft_model(flags):
        if draft_gguf is None:
            raise AutotuneError(
                f"the {export.method} export drafts in llama.cpp with a draft model of the "
                "user's: pass --draft-gguf FILE.gguf (a small model with the same tokenizer)"
            )
        flags += ["--spec-draft-model", str(draft_gguf)]
    return flags


def load_report_lines(method: str, load: EngineLoad) -> list[str]:
    """Per level, the export's throughput speedup in the engine; the crossover."""
    from autotune.measure.load import requests_text
    from autotune.measure.timing import interval_text

    lines = [
        f"{method} in {load.release} ({load.setting}), llama-server with {load.parallel} "
        f"slots, {load.max_new_tokens} tokens a request, against the same server without "
        "speculation:"
    ]
    for level in load.levels:
        lines.append(
            f"  {requests_text(level.concurrency):>12} in flight: "
            f"{interval_text(level.model_dump())} "
            f"({level.tokens_per_s:.1f} vs {level.baseline_tokens_per_s:.1f} tokens/s, "
            f"{level.rounds} rounds)  lossless {level.lossless}"
        )
    if load.crossover:
        lines.append(f"speculation is no faster from {requests_text(load.crossover)} in flight on")
    else:
        lines.append("speculation is clearly faster at every level measured")
    return lines
