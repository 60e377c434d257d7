"""`autotune profile`: tune every method that applies, choose on search prompts, measure
each final setting once on held-back prompts, write the profile.

The steps, in order: ``make_plan`` (which methods, their search spaces and heads; cheap
checks before any long work), ``open_workspace`` (the model and prompts),
``check_machine`` (is it quiet enough to time?), ``tune_methods`` (each method's choice,
on the search split), ``fit_expansions`` (CAPE on the chain methods), ``select`` (every
method's final candidates side by side on search prompts: whether CAPE is kept, and the
ranking of the methods), ``measure_held_back`` (every final setting against plain greedy
decoding, interleaved, on prompts no choice was made on, until the top-ranked method's
interval decides), ``decide`` (the verdict, with its reason) and ``assemble``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.budget import Budget
from autotune.engine.sampling import GREEDY
from autotune.errors import AutotuneError
from autotune.measure.noise import NoiseRecord, probe, settle
from autotune.measure.sequential import FIRST_LOOK
from autotune.measure.timing import MIN_PROMPTS as LEAST_COMPARED  # prompts, side by side
from autotune.measure.timing import EncodedPrompt, Measurement, Variant, interval_text
from autotune.methods import registry
from autotune.methods.base import DraftEnv, Entry, Method, TuneContext
from autotune.profile.blocks import (
    Environment,
    Figures,
    HardwareInfo,
    Measured,
    MethodSettings,
    ModelInfo,
    Verdict,
    Workload,
)
from autotune.profile.io import check_writable, write_profile
from autotune.profile.report import plot_path, write_verdict_plot
from autotune.profile.schema import ProfileBase, methods_block, profile_model
from autotune.progress import say, step
from autotune.schedule import Phase, Schedule, clock
from autotune.studies.workers import Workers
from autotune.training.job import ANSWERS_SHARE
from autotune.workspace import Workspace

# The held-back measurement: at most this many prompts (``--heldback-prompts``), of this
# many tokens each (``--max-new-tokens``); the selection's: search prompts and tokens.
HELDBACK_PROMPTS = 24
HELDBACK_TOKENS = 128
SELECT_PROMPTS = 8
SELECT_TOKENS = 64
# A method is recommended when its held-back interval's low end clears 1 + MARGIN.
MARGIN = 0.0
# The whole run's time (``--budget``): head training, searches, selection, measurement.
BUDGET_S = 20 * 60.0
# Heads are trained within the run on models up to this size on a CPU (larger ones take
# `autotune heads train` on a GPU, or longer than a profile's budget).
CPU_TRAINABLE_PARAMS = 1_000_000_000
# Heads trained within the run learn from answers this long (all trainers share them).
ANSWER_TOKENS = 128
# Shares of the time left after measurement: training (when heads are trained).
TRAINING_SHARE = 0.55
# Decoding with a method costs about this much of greedy's time (for the plan only;
# measured on 2 cores: 0.71 to 1.23, 0.93 on average over four methods).
SPECULATIVE_COST = 0.95
# The selection and held-back measurement take at most this share of the budget: beyond
# it they measure fewer prompts.
MEASURE_SHARE = 0.35
# Of the searches' time, what fitting CAPE on the chain methods takes.
CAPE_SHARE = 0.15
# Too little time to train a head kind usefully: it is skipped, with the command to run.
# A GLIDE draft first runs the target over every training sequence for its cache (about
# a minute on 2 cores for SmolLM2-135M), and learned nothing measurable (top-1 0.002) in
# the 100 s after it that a 20-minute budget leaves.
MIN_TRAINING_S = {"default": 45.0, "glide": 300.0}
LOSSLESS_REFERENCE = (
    "plain greedy decoding by autotune's own runner (the same weights and "
    "kernels); see the README for its parity with transformers' generate"
)


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
    select_prompts: int = SELECT_PROMPTS
    margin: float = MARGIN
    workers: Workers = field(default_factory=Workers)
    dtype: str = "auto"  # auto, float32, bfloat16, float16 (autotune.hardware)
    device: str = "auto"  # auto, cpu, cuda, cuda:N
    budget_s: float | None = BUDGET_S  # the whole run (``--budget``)
    train_heads: bool = True  # train missing heads within the run, when the model allows


@dataclass
class Plan:
    """The methods to tune, with their search spaces and head folders."""

    methods: list[Method]
    expansions: list[Entry]
    spaces: dict[str, Any]
    heads: dict[str, Path]
    skipped: dict[str, str]  # method -> why it does not run
    train: dict[str, str] = field(default_factory=dict)  # method -> head kind to train

    def skip(self, name: str, why: str) -> None:
        """``name`` does not run (nor are its heads trained), for the reason ``why``."""
        self.skipped[name] = why
        self.train.pop(name, None)
        self.methods = [m for m in self.methods if m.name != name]


@dataclass
class HeldBack:
    """The final measurement and what it decided."""

    measured: dict[str, Measurement]
    looks: int
    stopped: str


def run_profile(request: ProfileRequest) -> tuple[ProfileBase, Path]:
    budget = Budget(request.budget_s)
    plan = make_plan(request)
    ws = open_workspace(request)
    out = request.out or default_out(ws.target.name)
    check_writable(out)
    noise = check_machine(ws)
    schedule = make_schedule(plan, ws, request, budget)
    train_heads(plan, ws, schedule)
    tuned = tune_methods(plan, ws, request, schedule)
    fit_expansions(plan, ws, tuned, schedule)
    ranking = select(ws, tuned, request, schedule)
    held = measure_held_back(ws, tuned, ranking, request, noise, schedule)
    verdict = decide(tuned, ranking, held, request.margin, plan.skipped)
    profile = assemble(ws, tuned, held, verdict, noise, request)
    write_profile(profile, out)
    write_verdict_plot(profile, plot_path(out))
    return profile, out


def default_out(model_name: str) -> Path:
    return Path("profiles") / f"{model_name}.yaml"


# --- before any long work -------------------------------------------------------------


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
    heads, skipped = find_heads(methods, request)
    train = {
        name: str(registry.method(name).heads) for name, why in skipped.items() if why == TRAIN
    }
    skipped = {name: why for name, why in skipped.items() if why != TRAIN}
    methods = [m for m in methods if m.name not in skipped]
    spaces = {e.name: e.space(request.search_spaces.get(e.name)) for e in methods + expansions}
    return Plan(methods, expansions, spaces, heads, skipped, train)


def find_heads(
    methods: list[Method], request: ProfileRequest
) -> tuple[dict[str, Path], dict[str, str]]:
    """The head folder of each method that drafts with heads: the one given, else one
    found (``training.sources``); the methods whose heads are to be trained (marked in the
    returned reasons with ``TRAIN``) or that cannot run, with the reason (an error when
    they were asked for and cannot be trained)."""
    from autotune.models import resolve_model
    from autotune.models.registry import fingerprint
    from autotune.training.sources import find_heads as find

    heads, skipped = {}, {}
    needs = [m for m in methods if m.heads is not None]
    resolved = resolve_model(request.model, request.model_path) if needs else None
    for method in needs:
        given = request.heads.get(method.name)
        if given is not None:
            folder = Path(given).expanduser().resolve()
            method.check_heads(folder)
            heads[method.name] = folder
            continue
        assert resolved is not None and method.heads is not None
        found = find(method.heads, resolved.name, fingerprint(resolved), method.check_heads)
        if found is not None:
            say(f"{method.name}: {method.heads} heads from {found.source}: {found.folder}")
            heads[method.name] = found.folder
        elif request.train_heads:
            skipped[method.name] = TRAIN
        else:
            why = (
                f"no {method.heads} heads given or found: pass --heads {method.name}=DIR, "
                f"or train them with `autotune heads train --kind {method.heads}`"
            )
            if request.methods is not None:
                raise AutotuneError(f"--methods {method.name}: {why}")
            skipped[method.name] = why
    return heads, skipped


TRAIN = "to be trained"


def open_workspace(request: ProfileRequest) -> Workspace:
    from autotune.models.ref import TargetRef

    if request.out is not None:
        check_writable(request.out)
    ref = TargetRef.for_user(request.model, request.model_path, request.dtype, request.device)
    return Workspace.open(ref, request.prompts, request.storage)


def check_machine(ws: Workspace) -> NoiseRecord:
    """Probe the machine before timing; a busy one is said and given time to settle."""
    noise = NoiseRecord(before=settle(ws.runner, say))
    if noise.before[-1].busy:
        say(
            f"[yellow]timing on a busy machine ({'; '.join(noise.before[-1].reasons)}): the "
            "intervals will be wider, and the profile records it[/yellow]"
        )
    return noise


def make_schedule(plan: Plan, ws: Workspace, request: ProfileRequest, budget: Budget) -> Schedule:
    """The run's phases and their seconds, from this machine's measured speed, printed.
    Heads that cannot be trained here, or not in the time there is, are dropped first
    (with the command that trains them), and the time is planned without them."""
    tokens_per_s = 1.0 / ws.forward_seconds_now()  # one greedy sequence, this machine
    left = budget.left()
    seconds = 3600.0 if left is None else left
    phases = _phases(plan, ws, request, tokens_per_s, seconds)
    # a kind dropped leaves more time to the others: plan again until every kind left fits
    while (untrainable := _cannot_train(ws, phases, plan)) is not None:
        kinds, why_not = untrainable
        for name, kind in [(n, k) for n, k in plan.train.items() if k in kinds]:
            plan.skip(
                name,
                f"{why_not}: train {kind} heads with `autotune heads train --kind {kind} "
                f"--model {ws.ref.spec}` (profile finds them in its heads cache)",
            )
        phases = _phases(plan, ws, request, tokens_per_s, seconds)
    schedule = Schedule(budget, phases)
    for line in schedule.lines():
        say(line)
    return schedule


def tuning_schedule(plan: Plan, seconds: float = 3600.0) -> Schedule:
    """The searches alone, ``seconds`` each (the methods' and fitting CAPE): for scripts
    that run ``tune_methods`` and ``fit_expansions`` without a whole profile's plan."""
    names = [f"tune {m.name}" for m in plan.methods] + ["fit CAPE"]
    return Schedule(Budget(None), [Phase(name, seconds) for name in names])


def _phases(
    plan: Plan, ws: Workspace, request: ProfileRequest, tokens_per_s: float, seconds: float
) -> list[Phase]:
    """The selection and the held-back measurement are planned from the tokens they
    decode (at most ``MEASURE_SHARE`` of the time, but never under their least: the
    selection takes fewer prompts); head training and the searches share the rest."""
    chains = sum(m.chain for m in plan.methods) if plan.expansions else 0
    decoders = 1 + len(plan.methods)  # plain greedy and every method, side by side
    # a method decodes faster than greedy or is dropped; the first look usually decides
    cost = 1 + SPECULATIVE_COST * len(plan.methods)
    held_back = min(request.heldback_prompts, FIRST_LOOK)
    per_select_prompt = SELECT_TOKENS * (cost + SPECULATIVE_COST * chains) / tokens_per_s
    # the held-back measurement takes its first look whatever the budget (its least); the
    # selection gets what the measuring share leaves, down to its least
    held_back_s = held_back * request.max_new_tokens * cost / tokens_per_s
    select = min(
        request.select_prompts,
        max(LEAST_COMPARED, int((MEASURE_SHARE * seconds - held_back_s) / per_select_prompt)),
    )
    measuring = [
        Phase(
            "selection (search prompts)",
            select * per_select_prompt,
            f"{select} prompts x {decoders + chains} decoders",
            reserved=True,
            count=select,
        ),
        Phase(
            "held-back measurement",
            held_back_s,
            f"{held_back} prompts x {decoders} decoders (more when undecided), "
            f"{tokens_per_s:.0f} tokens/s greedy",
            reserved=True,
        ),
    ]
    rest = max(seconds - sum(p.seconds for p in measuring), 0.0)
    training: list[Phase] = []
    if plan.train:
        share = TRAINING_SHARE * rest
        answers = min(ANSWERS_SHARE * share, _answers_seconds(ws, tokens_per_s))
        kinds = list(dict.fromkeys(plan.train.values()))
        training = [Phase("self-distillation answers (shared)", answers, "decoded once")]
        training += [Phase(f"train {kind} heads", (share - answers) / len(kinds)) for kind in kinds]
        rest -= share
    expansion = CAPE_SHARE * rest if chains else 0.0
    per_method = (rest - expansion) / max(len(plan.methods), 1)
    tuning = [Phase(f"tune {m.name}", per_method) for m in plan.methods]
    if chains:
        tuning.append(Phase("fit CAPE", expansion, f"{chains} chain methods"))
    return training + tuning + measuring


def _answers_seconds(ws: Workspace, tokens_per_s: float) -> float:
    """Decoding every calibration answer: the workload's search split and every packaged
    prompt's (``training.job.decode_calibration``)."""
    from autotune.prompts import split_prompts
    from autotune.training.job import answers_seconds, calibration_extras

    prompts = split_prompts(ws.prompts)[0] + calibration_extras(ws.prompts_path)
    return answers_seconds(1.0 / tokens_per_s, ANSWER_TOKENS, prompts)


def _cannot_train(ws: Workspace, phases: list[Phase], plan: Plan) -> tuple[set, str] | None:
    """Head kinds that cannot be trained here, or usefully in the time planned for them
    (the one needing the most time first), with the reason; None when every kind can."""
    if not plan.train:
        return None
    params = sum(p.numel() for p in ws.target.model.parameters())
    if ws.runner.device.type == "cpu" and params > CPU_TRAINABLE_PARAMS:
        why = f"the model has {params / 1e9:.1f}B parameters, too many to train heads on a CPU"
        return set(plan.train.values()), why
    planned = {p.name.removeprefix("train ").removesuffix(" heads"): p.seconds for p in phases}
    short = [k for k in set(plan.train.values()) if planned[k] < min_training_s(k)]
    if not short:
        return None
    kind = max(short, key=min_training_s)
    return {kind}, (
        f"the budget leaves {clock(planned[kind])} (m:s) to train {kind} heads, under the "
        f"{clock(min_training_s(kind))} they need to be worth measuring; give more --budget, or"
    )


def min_training_s(kind: str) -> float:
    return MIN_TRAINING_S.get(kind, MIN_TRAINING_S["default"])


def train_heads(plan: Plan, ws: Workspace, schedule: Schedule) -> None:
    """Heads for the methods that have none, trained now on the model's shared
    self-distillation answers (the packaged calibration prompts that fit the time, and
    the workload's search split), kept in autotune's heads cache for the next run."""
    if not plan.train:
        return
    from autotune.training.job import decode_calibration, train_kind

    seconds = schedule.begin("self-distillation answers (shared)").seconds
    extras = decode_calibration(ws.target, ws.prompts_path, ws.prompts, ANSWER_TOKENS, seconds)
    ws.decode_missing = False  # the tuners calibrate on what fitted the time, too
    for kind in dict.fromkeys(plan.train.values()):
        seconds = schedule.begin(f"train {kind} heads").seconds
        names = [n for n, k in plan.train.items() if k == kind]
        try:
            folder = train_kind(ws, extras, ANSWER_TOKENS, kind, seconds)
        except AutotuneError as exc:  # e.g. too few answers fitted the time to train on
            for name in names:
                plan.skip(name, f"its {kind} heads could not be trained: {exc}")
            continue
        for name in names:
            plan.heads[name] = folder


# --- choices, on the search split -----------------------------------------------------


def tune_methods(
    plan: Plan, ws: Workspace, request: ProfileRequest, schedule: Schedule
) -> dict[str, MethodSettings]:
    """Each method's setting, chosen on the search split within its share of the time
    (or ``--time-budget`` seconds each, when given)."""
    for name, why in plan.skipped.items():
        say(f"[yellow]{name} skipped: {why}[/yellow]")
    tuned = {}
    for method in plan.methods:
        share = schedule.begin(f"tune {method.name}")
        say(f"{method.name}: {method.title}")
        ctx = TuneContext(
            ws,
            plan.spaces[method.name],
            share if request.time_budget_s is None else Budget(request.time_budget_s),
            request.workers,
            plan.heads.get(method.name),
            request.trials,
        )
        settings = method.tune(ctx)
        tuned[method.name] = settings.model_copy(update={"notes": settings.notes + ctx.notes})
    return tuned


def fit_expansions(
    plan: Plan, ws: Workspace, tuned: dict[str, MethodSettings], schedule: Schedule
) -> None:
    """CAPE for every chain method, fitted on the search split (``select`` decides whether
    the method keeps it)."""
    from autotune.methods.cape.fit import fit

    if not any(m.chain for m in plan.methods) or not plan.expansions:
        return
    budget = schedule.begin("fit CAPE")
    for expansion in plan.expansions:
        for method in plan.methods:
            if not method.chain:
                continue
            ctx = TuneContext(
                ws,
                plan.spaces[expansion.name],
                budget.part(0.5),
                Workers(),
                plan.heads.get(method.name),
                base_space=plan.spaces[method.name],
            )
            cape = fit(method, tuned[method.name], ctx)
            tuned[method.name] = tuned[method.name].model_copy(update={"cape": cape})


def select(
    ws: Workspace, tuned: dict[str, MethodSettings], request: ProfileRequest, schedule: Schedule
) -> list[str]:
    """Every method's final candidates (a chain method with and without its fitted
    expansion) decoded side by side on search prompts: each chain method keeps CAPE where
    it was faster there, and the methods are ranked by what they keep, fastest first."""
    from autotune.measure.timing import measure_variants

    env = DraftEnv(ws.ref, ws.runner)
    variants = {
        name: candidate
        for method_name, settings in tuned.items()
        for name, candidate in candidates(method_name, settings, env).items()
    }
    share = schedule.begin("selection (search prompts)").seconds
    planned = schedule.planned("selection (search prompts)")
    count = (
        request.select_prompts
        if share is None
        else _fit(planned.count or request.select_prompts, share, planned.seconds)
    )
    prompts = spread(ws.encode(ws.search_prompts()), count)
    with step(
        "selection: every method side by side (search prompts)", len(prompts) * len(variants)
    ) as advance:
        measured = measure_variants(
            ws.runner,
            variants,
            prompts,
            SELECT_TOKENS,
            on_prompt=lambda _: advance(),
            until=None if share is None else Budget(share),
        )
    figures = {}
    for name, settings in tuned.items():
        tuned[name], figures[name] = keep_faster(settings, name, measured)
    ranking = sorted(tuned, key=lambda n: -figures[n].speedup)
    say(
        "on search prompts: "
        + ", ".join(f"{n} {interval_text(figures[n].model_dump())}" for n in ranking)
    )
    return ranking


def candidates(name: str, settings: MethodSettings, env: DraftEnv) -> dict[str, Variant]:
    method = registry.method(name)
    cape = getattr(settings, "cape", None)
    if cape is None:
        return {name: method.variant(settings, env)}
    without = settings.model_copy(update={"cape": cape.model_copy(update={"enabled": False})})
    with_cape = settings.model_copy(update={"cape": cape.model_copy(update={"enabled": True})})
    return {name: method.variant(without, env), f"{name}+cape": method.variant(with_cape, env)}


def keep_faster(
    settings: MethodSettings, name: str, measured: dict[str, Measurement]
) -> tuple[MethodSettings, Figures]:
    """The settings with the faster of their candidates, and its selection figures."""
    cape = getattr(settings, "cape", None)
    chosen = name
    if cape is not None:
        enabled = measured[f"{name}+cape"].speedup > measured[name].speedup
        chosen = f"{name}+cape" if enabled else name
        search = {
            **cape.search,
            "selection_on_search_prompts": {
                "without": measured[name].summary(False)["speedup"],
                "with": measured[f"{name}+cape"].summary(False)["speedup"],
            },
        }
        settings = settings.model_copy(
            update={"cape": cape.model_copy(update={"enabled": enabled, "search": search})}
        )
    figures = Figures(**measured[chosen].summary(with_categories=False))
    return settings.model_copy(update={"selection": figures}), figures


def _fit(count: int, seconds: float, planned: float) -> int:
    """``count`` prompts planned to take ``planned`` seconds, cut to fit ``seconds``."""
    return max(LEAST_COMPARED, min(count, int(count * seconds / max(planned, 1e-9))))


def spread(prompts: list[EncodedPrompt], count: int) -> list[EncodedPrompt]:
    """``count`` prompts taken evenly through the list (files group prompts by category)."""
    if count >= len(prompts):
        return list(prompts)
    return [prompts[i * len(prompts) // count] for i in range(count)]


# --- the held-back measurement and the verdict ------------------------------------------


def measure_held_back(
    ws: Workspace,
    tuned: dict[str, MethodSettings],
    ranking: list[str],
    request: ProfileRequest,
    noise: NoiseRecord,
    schedule: Schedule,
) -> HeldBack:
    """Every final setting against one plain greedy decoding per prompt, interleaved, on
    held-back prompts, until the interval of the method ranked first decides against the
    bound (or the prompts run out); the figures reported."""
    from autotune.measure.sequential import measure_until_decided
    from autotune.measure.timing import SideBySide

    if not tuned:
        return HeldBack({}, 0, "no method")
    env = DraftEnv(ws.ref, ws.runner)
    variants = {
        name: registry.method(name).variant(settings, env) for name, settings in tuned.items()
    }
    budget = schedule.begin("held-back measurement")
    prompts = ws.encode(ws.heldback_prompts()[: request.heldback_prompts])
    session = SideBySide(ws.runner, variants, request.max_new_tokens)
    top = ranking[0] if ranking and _selection_speedup(tuned[ranking[0]]) > 1.0 else None
    with step(
        "held-back measurement, every method against plain greedy", len(prompts) * len(variants)
    ) as advance:
        result = measure_until_decided(
            session,
            prompts,
            top,
            1.0 + request.margin,
            budget,
            between=lambda: noise.during.append(probe(ws.runner)),
            on_prompt=lambda _: advance(),
        )
    return HeldBack(result.measurements, result.looks, result.stopped)


def _selection_speedup(settings: MethodSettings) -> float:
    return settings.selection.speedup if settings.selection is not None else 0.0


def decide(
    tuned: dict[str, MethodSettings],
    ranking: list[str],
    held: HeldBack,
    margin: float,
    skipped: dict[str, str] | None = None,
) -> Verdict:
    """The method ranked first on the search prompts is recommended when its held-back
    interval clears 1 + margin; otherwise none, with the reason. (One candidate, chosen
    before the held-back prompts were seen: the held-back figures choose nothing.)
    ``skipped``: the methods not run, with why; the verdict keeps them."""
    bound = 1.0 + margin
    verdict = Verdict(
        recommended="none",
        reason="",
        margin=margin,
        ranking=ranking,
        held_back_looks=held.looks,
        skipped=dict(skipped or {}),
    )
    if not ranking:
        verdict.reason = "no method was tuned"
        return verdict
    top = ranking[0]
    if _selection_speedup(tuned[top]) <= 1.0:
        verdict.reason = (
            f"no method was faster than plain greedy decoding on the search "
            f"prompts (the fastest, {top}, ran at "
            f"{_selection_speedup(tuned[top]):.3f}x)"
        )
        return verdict
    measured = held.measured[top]
    interval = measured.interval()
    text = (
        f"{top}, the fastest on the search prompts, measured {interval_text(measured)} "
        f"on {len(measured.prompts)} held-back prompts"
    )
    if measured.lossless is False:
        verdict.reason = f"{text}, but its output differed from plain greedy decoding"
    elif interval.above(bound):
        verdict.recommended = top
        verdict.reason = f"{text}: its interval lies above {bound:.2f}"
    else:
        verdict.reason = f"{text}: its interval does not clear {bound:.2f}"
    return verdict


def assemble(
    ws: Workspace,
    tuned: dict[str, MethodSettings],
    held: HeldBack,
    verdict: Verdict,
    noise: NoiseRecord,
    request: ProfileRequest,
) -> ProfileBase:
    blocks = {
        name: settings.model_copy(update={"measured": Measured(**held.measured[name].summary())})
        for name, settings in tuned.items()
    }
    categories = sorted({p.category for p in ws.prompts if p.category})
    return profile_model()(
        model=model_info(ws),
        hardware=HardwareInfo(**ws.hardware),
        environment=Environment(noise=noise.as_dict()),
        workload=Workload(
            prompts=str(ws.prompts_path.resolve()),
            num_prompts=len(ws.prompts),
            max_new_tokens=request.max_new_tokens,
            temperature=GREEDY.temperature,
            categories=categories or None,
            lossless_reference=LOSSLESS_REFERENCE,
        ),
        recommended=verdict.recommended,
        verdict=verdict,
        methods=methods_block(**blocks),
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


# --- for people -----------------------------------------------------------------------


def verdict_lines(profile: ProfileBase) -> list[str]:
    """What the verdict table (``profile.report.verdict_table``) does not show: CAPE's
    bins where kept, each method's notes, a busy machine, then the recommendation."""
    lines = []
    for name, method in profile.method_blocks().items():
        cape = getattr(method, "cape", None)
        if method.measured is not None and cape is not None and cape.enabled:
            lines.append(f"{name} keeps cape: {cape.policy().describe()}")
        lines += [f"{name} note: {note}" for note in method.notes]
    if profile.verdict is not None:
        lines += [f"{name} skipped: {why}" for name, why in profile.verdict.skipped.items()]
    noise = profile.environment.noise if profile.environment else {}
    if noise.get("busy"):
        lines.append(f"the machine was busy while timing: {'; '.join(noise['reasons'])}")
    verdict = profile.verdict
    reason = f" ({verdict.reason})" if verdict is not None else ""
    lines.append(f"recommended: {profile.recommended}{reason}")
    return lines
