"""`autotune profile`: tune every method that applies, measure each setting once on
held-back prompts, write the profile.

The steps, in order: ``plan`` (which methods, their search spaces and heads; cheap checks
before any long work), ``open_workspace`` (the model and prompts), ``tune_methods`` (each
method's choice, on the search split), ``fit_expansions`` (CAPE on the chain methods, kept
where it decodes faster on the search split), ``measure_held_back`` (every final setting
against plain greedy decoding, interleaved, on prompts no choice was made on), and
``assemble`` the profile.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.budget import Budget
from autotune.engine.sampling import GREEDY
from autotune.errors import AutotuneError
from autotune.methods import registry
from autotune.methods.base import DraftEnv, Entry, Method, TuneContext
from autotune.profile.blocks import HardwareInfo, Measured, MethodSettings, ModelInfo, Workload
from autotune.profile.io import check_writable, write_profile
from autotune.profile.schema import ProfileBase, methods_block, profile_model, recommend
from autotune.progress import say, step
from autotune.studies.workers import Workers
from autotune.workspace import Workspace

# The held-back measurement: prompts and tokens per prompt (``--heldback-prompts``).
HELDBACK_PROMPTS = 16
HELDBACK_TOKENS = 128


@dataclass
class ProfileRequest:
    """What `autotune profile` was asked to do."""

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
    heldback_prompts: int = HELDBACK_PROMPTS
    max_new_tokens: int = HELDBACK_TOKENS
    workers: Workers = field(default_factory=Workers)
    dtype: str = "float32"
    device: str = "cpu"


@dataclass
class Plan:
    """The methods to tune, with their search spaces and head folders."""

    methods: list[Method]
    expansions: list[Entry]
    spaces: dict[str, Any]
    heads: dict[str, Path]
    skipped: dict[str, str]  # method -> why it does not run


def run_profile(request: ProfileRequest) -> tuple[ProfileBase, Path]:
    plan = make_plan(request)
    ws = open_workspace(request)
    out = request.out or default_out(ws.target.name)
    check_writable(out)
    tuned, notes = tune_methods(plan, ws, request)
    fit_expansions(plan, ws, tuned, notes)
    measured = measure_held_back(ws, tuned, request)
    profile = assemble(ws, tuned, measured, request)
    write_profile(profile, out)
    return profile, out


def default_out(model_name: str) -> Path:
    return Path("profiles") / f"{model_name}.yaml"


# --- the steps ------------------------------------------------------------------------


def parse_methods(text: str) -> tuple[str, ...]:
    """``--methods``: registered names (any spelling ``registry.normalise`` takes)."""
    names = tuple(registry.get(m).name for m in text.split(",") if m.strip())
    if not names:
        raise AutotuneError(f"no method named: choose from {', '.join(registry.names())}")
    return tuple(dict.fromkeys(names))


def make_plan(request: ProfileRequest) -> Plan:
    """Which methods run, with what search spaces and heads; every check that needs no
    model is made here, before any long work."""
    asked = request.methods or tuple(registry.names())
    entries = [registry.get(name) for name in asked]
    for name in list(request.heads) + list(request.search_spaces):
        if registry.get(name).name not in asked:
            raise AutotuneError(
                f"settings were given for {name}, which --methods leaves out: "
                f"add {name} to --methods or drop them"
            )
    methods = [e for e in entries if isinstance(e, Method)]
    expansions = [e for e in entries if e.kind == "expansion"]
    if expansions and not any(m.chain for m in methods):
        chains = [n for n, e in registry.methods().items() if e.chain]
        raise AutotuneError(
            f"{expansions[0].name} widens a chain method's drafts: add one of "
            f"{', '.join(chains)} to --methods"
        )
    heads, skipped = {}, {}
    for method in list(methods):
        if method.heads is None:
            continue
        given = request.heads.get(method.name)
        if given is None:
            why = (
                f"no {method.heads} heads given: pass --heads {method.name}=DIR, or train "
                f"them with `autotune heads train --kind {method.heads}`"
            )
            if request.methods is not None:
                raise AutotuneError(f"--methods {method.name}: {why}")
            skipped[method.name] = why
            methods.remove(method)
            continue
        folder = Path(given).expanduser().resolve()
        method.check_heads(folder)
        heads[method.name] = folder
    spaces = {e.name: e.space(request.search_spaces.get(e.name)) for e in methods + expansions}
    return Plan(methods, expansions, spaces, heads, skipped)


def open_workspace(request: ProfileRequest) -> Workspace:
    from autotune.models.ref import TargetRef

    if request.out is not None:
        check_writable(request.out)
    ref = TargetRef.for_user(request.model, request.model_path, request.dtype, request.device)
    return Workspace.open(ref, request.prompts, request.storage)


def tune_methods(
    plan: Plan, ws: Workspace, request: ProfileRequest
) -> tuple[dict[str, MethodSettings], dict[str, list[str]]]:
    """Each method's setting, chosen on the search split within its time budget."""
    for name, why in plan.skipped.items():
        say(f"[yellow]{name} skipped: {why}[/yellow]")
    tuned, notes = {}, {}
    for method in plan.methods:
        say(f"[bold]{method.name}[/bold]: {method.title}")
        ctx = TuneContext(
            ws,
            plan.spaces[method.name],
            Budget(request.time_budget_s),
            request.workers,
            plan.heads.get(method.name),
            request.trials,
        )
        tuned[method.name] = method.tune(ctx)
        notes[method.name] = ctx.notes
    return tuned, notes


def fit_expansions(
    plan: Plan, ws: Workspace, tuned: dict[str, MethodSettings], notes: dict[str, list[str]]
) -> None:
    """CAPE for every chain method, fitted on the search split, and kept (``enabled``)
    where the method decodes faster with it on search prompts."""
    from autotune.methods.cape.fit import fit

    for expansion in plan.expansions:
        space = plan.spaces[expansion.name]
        for method in plan.methods:
            if not method.chain:
                continue
            ctx = TuneContext(
                ws,
                space,
                Budget(None),
                Workers(),
                plan.heads.get(method.name),
                base_space=plan.spaces[method.name],
                notes=notes[method.name],
            )
            cape = fit(method, tuned[method.name], ctx)
            settings = tuned[method.name].model_copy(update={"cape": cape})
            enabled, speedups = faster_with_expansion(method, settings, ws, space)
            cape.enabled = enabled
            cape.search["selection_on_search_prompts"] = speedups
            tuned[method.name] = settings


def faster_with_expansion(
    method: Method, settings, ws: Workspace, space
) -> tuple[bool, dict[str, float]]:
    """Decode the method with and without its expansion, side by side on search prompts
    the fit did not replay; whether the expansion was faster, and both speedups."""
    from autotune.measure.timing import measure_variants

    env = DraftEnv(ws.ref, ws.runner)
    plain = settings.model_copy(
        update={"cape": settings.cape.model_copy(update={"enabled": False})}
    )
    makers = {
        "without": method.variant(plain, env),
        "with": method.variant(settings, env),
    }
    prompts = ws.encode(ws.search_prompts()[-space.selection.prompts :])
    with step(
        f"{method.name}: with and without cape (search prompts)", len(prompts) * len(makers)
    ) as advance:
        measured = measure_variants(
            ws.runner, makers, prompts, space.selection.tokens, on_prompt=lambda _: advance()
        )
    speedups = {name: round(m.speedup, 4) for name, m in measured.items()}
    return speedups["with"] > speedups["without"], speedups


def measure_held_back(
    ws: Workspace, tuned: dict[str, MethodSettings], request: ProfileRequest
) -> dict[str, Measured]:
    """Every final setting against one plain greedy decoding per prompt, interleaved, on
    the held-back prompts: the figures reported."""
    from autotune.measure.timing import measure_variants

    env = DraftEnv(ws.ref, ws.runner)
    makers = {
        name: registry.method(name).variant(settings, env)
        for name, settings in tuned.items()
    }
    if not makers:
        return {}
    prompts = ws.encode(ws.heldback_prompts()[: request.heldback_prompts])
    with step(
        "held-back measurement, every method against plain greedy", len(prompts) * len(makers)
    ) as advance:
        measured = measure_variants(
            ws.runner, makers, prompts, request.max_new_tokens, on_prompt=lambda _: advance()
        )
    return {name: Measured(**m.summary()) for name, m in measured.items()}


def assemble(
    ws: Workspace,
    tuned: dict[str, MethodSettings],
    measured: dict[str, Measured],
    request: ProfileRequest,
) -> ProfileBase:
    blocks = {
        name: settings.model_copy(update={"measured": measured[name]})
        for name, settings in tuned.items()
    }
    methods = methods_block(**blocks)
    return profile_model()(
        model=model_info(ws),
        hardware=HardwareInfo(**ws.hardware),
        workload=Workload(
            prompts=str(ws.prompts_path.resolve()),
            num_prompts=len(ws.prompts),
            max_new_tokens=request.max_new_tokens,
            temperature=GREEDY.temperature,
        ),
        recommended=recommend(methods),
        methods=methods,
    )


def model_info(ws: Workspace) -> ModelInfo:
    cfg = ws.runner.config
    return ModelInfo(
        name=ws.target.name,
        path=str(ws.target.path),
        fingerprint=ws.target.fingerprint,
        architecture=ws.target.architecture,
        num_layers=ws.runner.num_layers,
        hidden_size=cfg.hidden_size,
        vocab_size=cfg.vocab_size,
        dtype=ws.target.dtype,
    )


def verdict(profile: ProfileBase) -> list[str]:
    """One line per method: what was measured and what it means."""
    lines = []
    for name, method in profile.method_blocks().items():
        m = method.measured
        if m is None:
            continue
        word = "faster" if m.speedup > 1.0 else "slower"
        cape = getattr(method, "cape", None)
        with_cape = f" with cape ({cape.policy().describe()})" if cape and cape.enabled else ""
        lines.append(
            f"{name}{with_cape}: {m.speedup:.3f}x plain greedy ({m.tokens_per_s:.1f} vs "
            f"{m.baseline_tokens_per_s:.1f} tokens/s, {m.tokens_per_step:.2f} "
            f"tokens/step, acceptance {m.acceptance_rate:.2f}, lossless {m.lossless}) "
            f"on {m.prompts} held-back prompts: {word} than plain greedy on this device"
        )
    if profile.recommended == "none":
        lines.append(
            "recommended: none. No method measured faster than plain greedy "
            "decoding here; serve without speculation on this device."
        )
    else:
        lines.append(f"recommended: {profile.recommended}")
    return lines
