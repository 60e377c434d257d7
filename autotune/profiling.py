"""`autotune profile`: tune the methods that can win, choose on search prompts, measure
the finalists once on held-back prompts, write the profile.

The run goes cheapest evidence first, re-planning before every phase from what it has
learned (``autotune.plan`` holds every share of the time): ``make_setup`` (which methods,
their search spaces and heads; cheap checks before any long work), ``open_workspace``
(the model and prompts), ``check_machine`` (is it quiet enough to time?), then ``Run``:
the answers to the search prompts; each method's probe (the draft-free ones measure a
first leader; the others get an optimistic bound, and are skipped when it cannot beat
the leader's lower bound); the training and tuning of the methods left, the leader's
study taking the time the skipped left; CAPE. Then ``select`` (the finalists side by
side on search prompts), ``measure_held_back`` (against plain greedy decoding, on
prompts no choice was made on), ``decide`` (the fastest finalist whose simultaneous
interval clears the bar) and ``assemble``; the ledger of where the time went goes into
the verdict.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune import plan
from autotune.budget import Budget
from autotune.engine.sampling import GREEDY
from autotune.errors import AutotuneError
from autotune.measure.load import LEVELS, TUNED, LevelResult, requests_text
from autotune.measure.noise import NoiseRecord, fewer_threads, probe, settle
from autotune.measure.stats import MIN_PROMPTS
from autotune.measure.timing import (
    EncodedPrompt,
    Measurement,
    Variant,
    categories_in_turn,
    interval_text,
)
from autotune.methods import registry
from autotune.methods.base import DraftEnv, Entry, Method, TuneContext
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
)
from autotune.profile.io import check_writable, write_profile
from autotune.profile.report import plot_path, write_verdict_plot
from autotune.profile.schema import ProfileBase, methods_block, profile_model
from autotune.progress import say, step
from autotune.schedule import Phase, Schedule, clock
from autotune.studies.workers import Workers
from autotune.workspace import Workspace

# The run's sizes and shares of time live in ``autotune.plan``; these are the defaults of
# `autotune profile`'s options.
HELDBACK_PROMPTS = plan.HELDBACK_PROMPTS
HELDBACK_TOKENS = plan.HELDBACK_TOKENS
SELECT_PROMPTS = plan.SELECT_PROMPTS
MARGIN = plan.MARGIN
BUDGET_S = plan.BUDGET_S
ANSWER_TOKENS = plan.ANSWER_TOKENS
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
    threads: int | None = None  # --threads (None: the cores, or one on a busy machine)
    # --engine (repeatable): deploying to these; the search keeps to what they express
    engines: tuple[str, ...] | None = None
    # --concurrency: the levels measured under load after the verdict, as the budget
    # allows (an empty tuple: none)
    concurrency: tuple[int, ...] = LEVELS


@dataclass
class Setup:
    """The methods asked for, with their search spaces and head folders: what the run
    starts from (the plan, ``autotune.plan``, decides what of it runs)."""

    methods: list[Method]
    expansions: list[Entry]
    spaces: dict[str, Any]
    heads: dict[str, Path]
    skipped: dict[str, str]  # method -> why it does not run
    train: dict[str, str] = field(default_factory=dict)  # method -> head kind to train


@dataclass
class HeldBack:
    """The final measurement and what it decided."""

    measured: dict[str, Measurement]
    looks: int
    stopped: str
    planned: int = 0  # the held-back prompts it could have measured


def run_profile(request: ProfileRequest) -> tuple[ProfileBase, Path]:
    budget = Budget(request.budget_s)
    setup = make_setup(request)
    ws = open_workspace(request)
    ws.deadline = budget
    out = request.out or default_out(ws.target.name)
    check_writable(out)
    noise = check_machine(ws, threads_chosen=request.threads is not None)
    run = Run(setup, ws, request, budget, noise)
    tuned = run.tune()
    selection = select(ws, tuned, request, run.begin("selection (search prompts)"))
    tuned = selection.tuned
    run.end(
        f"{len(selection.ranking) - len(selection.dropped)} of {len(selection.ranking)} "
        f"methods left in the race ({selection.stopped or 'no race'})"
    )
    held = measure_held_back(ws, selection, request, noise, run.begin("held-back measurement"))
    run.end(
        f"{', '.join(held.measured) or 'nothing'} on "
        f"{max((len(m.prompts) for m in held.measured.values()), default=0)} prompts"
    )
    verdict = decide(tuned, selection.ranking, held, request.margin, run.evidence.skipped)
    verdict.dropped = selection.dropped
    load_kept = run.planned("under load (held back)") if request.concurrency else 0.0
    if engine_settings_to_measure(tuned, verdict.recommended):
        run.begin("engine settings (held back)")  # the time the run has left, unplanned
        held = measure_engine_settings(
            ws, tuned, verdict.recommended, held, request, keep_s=load_kept
        )
        run.end(f"{verdict.recommended} as each engine serves it")
    if request.concurrency and verdict.recommended in tuned:
        run.begin("under load (held back)")  # planned; it takes what the run has left
        tuned = measure_load(ws, tuned, verdict.recommended, held, request)
        run.end(load_summary(tuned[verdict.recommended].load))
    verdict.time = run.ledger
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


def make_setup(request: ProfileRequest) -> Setup:
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
    if request.engines:
        methods, unserved = servable(methods, request.engines, request.methods is not None)
    else:
        unserved = {}
    heads, skipped = find_heads(methods, request)
    train = {
        name: str(registry.method(name).heads) for name, why in skipped.items() if why == TRAIN
    }
    skipped = {name: why for name, why in skipped.items() if why != TRAIN}
    methods = [m for m in methods if m.name not in skipped]
    spaces = {e.name: e.space(request.search_spaces.get(e.name)) for e in methods + expansions}
    return Setup(methods, expansions, spaces, heads, {**unserved, **skipped}, train)


def servable(
    methods: list[Method], engines: tuple[str, ...], asked: bool
) -> tuple[list[Method], dict[str, str]]:
    """The methods one of ``engines`` can serve, and why each other one is left out (an
    error when the user asked for methods and none of them can be served)."""
    from autotune.export.engines import ENGINES

    kept, unserved = [], {}
    for method in methods:
        if any(engine in method.exporters for engine in engines):
            kept.append(method)
            continue
        why = "; ".join(
            f"{ENGINES[e]}: {method.cannot_export.get(e, f'it has no {method.name} support')}"
            for e in engines
        )
        unserved[method.name] = f"--engine {', '.join(engines)} cannot serve it ({why})"
    if not kept:
        raise AutotuneError(
            f"none of the methods {'asked for' if asked else 'autotune has'} can be served by "
            f"{', '.join(engines)}: " + "; ".join(f"{m}: {why}" for m, why in unserved.items())
        )
    return kept, unserved


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

# Forwards in the machine check before each phase: enough to see a hog (with the others'
# load), few enough that fifteen checks cost seconds, not minutes.
PHASE_PROBE_FORWARDS = 6
# A forward that got this much slower or faster between checks is said in the verdict.
SPEED_CHANGE_SAID = 1.5


def open_workspace(request: ProfileRequest) -> Workspace:
    from autotune.models.ref import TargetRef

    if request.out is not None:
        check_writable(request.out)
    ref = TargetRef.for_user(request.model, request.model_path, request.dtype, request.device)
    ws = Workspace.open(ref, request.prompts, request.storage)
    ws.check_context(max(request.max_new_tokens, ANSWER_TOKENS))
    return ws


def check_machine(ws: Workspace, threads_chosen: bool = False) -> NoiseRecord:
    """Probe the machine before timing; a busy one is said and given time to settle, and
    (unless ``--threads`` was chosen) run on one torch thread where that is faster."""
    first = probe(ws.runner)
    # the threads first: the probes while it settles then cost a third (three CPU hogs)
    fewer = None if threads_chosen else fewer_threads(ws.runner, first)
    if fewer is not None:
        ws.hardware["threads"] = fewer.threads  # trials, cached timings and the profile
        say(
            f"[yellow]torch runs {fewer.threads} thread instead of {first.threads} on the busy "
            f"machine: a forward takes {fewer.forward_ms:.0f} ms instead of "
            f"{first.forward_ms:.0f}[/yellow]"
        )
    noise = NoiseRecord(before=[first, *([fewer] if fewer else []), *settle(ws.runner, say)])
    busy = noise.before[-1]
    if busy.busy:
        say(
            f"[yellow]timing on a busy machine ({'; '.join(busy.reasons)}): the "
            "intervals will be wider, and the profile records it[/yellow]"
        )
    return noise


def measure_facts(
    setup: Setup, ws: Workspace, request: ProfileRequest, budget_s: float | None = None
) -> plan.Facts:
    """What the plan is made from: this machine's forward time and verify curve, the
    methods in the order they run (draft-free first, head methods last), and what the
    answers phase has to decode."""
    from autotune.training.job import answered, calibration_extras, search_thirds
    from autotune.training.kinds import KINDS

    order = sorted(setup.methods, key=lambda m: (m.heads is not None, not m.draft_free))
    curve = ws.verify_curve(plan.PROBE_CURVE_TOKENS)
    trained, unseen, _ = search_thirds(ws.prompts)
    search = trained + unseen
    missing = len(search) - len(answered(ws.target, plan.ANSWER_TOKENS)(search))

    return plan.Facts(
        forward_s=curve(1),
        verify_relative=tuple(curve.relative()),
        methods=tuple(m.name for m in order),
        draft_free=tuple(m.name for m in order if m.draft_free),
        train=dict(setup.train),
        min_training={k: KINDS[k].min_training_s for k in set(setup.train.values())},
        chain_methods=tuple(m.name for m in setup.methods if m.chain) if setup.expansions else (),
        leader_tuning_s={
            m.name: seconds
            for m in order
            if (seconds := m.tuning_seconds(setup.spaces[m.name], curve(1), plan.LEADER_TRIALS))
        },
        answer_prompts=missing,
        extra_answer_prompts=len(calibration_extras(ws.prompts_path)) if setup.train else 0,
        heldback_prompts=min(request.heldback_prompts, len(ws.heldback_prompts())),
        heldback_tokens=request.max_new_tokens,
        select_prompts=request.select_prompts,
        params=sum(p.numel() for p in ws.target.model.parameters()),
        cpu=ws.runner.device.type == "cpu",
        budget_s=budget_s,
        load_levels=len(request.concurrency),
    )


def tuning_schedule(setup: Setup, seconds: float = 3600.0) -> Schedule:
    """The searches alone, ``seconds`` each (the methods' and fitting CAPE): for scripts
    that run ``tune_methods`` and ``fit_expansions`` without a whole profile's plan."""
    names = [f"tune {m.name}" for m in setup.methods] + ["fit CAPE"]
    return Schedule(Budget(None), [Phase(name, seconds) for name in names])


class Run:
    """One profile's run through its phases, cheapest evidence first. Before each phase
    the plan is made again from what is known (``autotune.plan.phases``): the phase gets
    its share of the time left, and the ledger records what it was planned, what it
    spent and what it bought."""

    def __init__(
        self,
        setup: Setup,
        ws: Workspace,
        request: ProfileRequest,
        budget: Budget,
        noise: NoiseRecord,
    ):
        self.setup, self.ws, self.request, self.budget, self.noise = (
            setup,
            ws,
            request,
            budget,
            noise,
        )
        self.facts = measure_facts(setup, ws, request, budget.seconds)
        self.evidence = plan.Evidence(skipped=dict(setup.skipped))
        self.ledger: list[dict] = []
        self.heads = dict(setup.heads)
        self._open: tuple[str, float, float] | None = None
        self._busy: list[str] = []
        self._refuse_small_budget()
        self._drop_untrainable()
        for line in self.schedule().lines():
            say(line)

    # --- the plan --------------------------------------------------------------------

    def seconds_left(self) -> float:
        left = self.budget.left()
        return 3600.0 if left is None else left

    def schedule(self) -> Schedule:
        return Schedule(
            self.budget,
            plan.phases(self.facts, self.evidence, self.seconds_left()),
            done=len(self.ledger),
        )

    def planned(self, name: str) -> float:
        """The seconds the plan made now gives phase ``name`` (0 when it has none)."""
        for phase in self.schedule().phases:
            if phase.name == name:
                return phase.seconds
        return 0.0

    def begin(self, name: str) -> Budget:
        """The phase ``name`` starts: its share of the time left, from a fresh plan."""
        schedule = self.schedule()
        try:
            share = schedule.begin(name)
            planned = share.seconds or 0.0
        except KeyError:  # not in the plan any more (e.g. its time is gone): its least
            share, planned = Budget(0.0), 0.0
        self._open = (name, planned, self.budget.elapsed())
        self._busy = self._watch_machine(name)
        return share

    def _watch_machine(self, phase: str) -> list[str]:
        """A short probe before each phase: a machine that became busy is said when it
        happens and recorded (the profile's noise block, the phase's ledger row)."""
        was_busy = self.noise.busy
        reading = probe(self.ws.runner, forwards=PHASE_PROBE_FORWARDS)
        self.noise.during.append(reading)
        if reading.busy and not was_busy:
            say(
                f"[yellow]the machine became busy before {phase} "
                f"({'; '.join(reading.reasons)}): its figures are taken on a busy machine, "
                "and the profile records it[/yellow]"
            )
        return reading.reasons

    def end(self, bought: str) -> None:
        assert self._open is not None
        name, planned, started = self._open
        self.ledger.append(
            {
                "phase": name,
                "planned_s": round(planned, 1),
                "spent_s": round(self.budget.elapsed() - started, 1),
                "bought": bought,
                **({"busy": "; ".join(self._busy)} if self._busy else {}),
            }
        )
        self.evidence.done.add(name)
        self._open = None

    def skip(self, method: str, why: str) -> None:
        say(f"[yellow]{method} skipped: {why}[/yellow]")
        self.evidence.skipped[method] = why

    def _refuse_small_budget(self) -> None:
        least = self.budget.elapsed() + plan.least_budget(self.facts)  # from the start
        if self.budget.seconds is not None and self.budget.seconds < least:
            busy = "; the machine is busy" if self.noise.busy else ""
            raise AutotuneError(
                f"--budget {clock(self.budget.seconds)} is too small for this model here (one "
                f"forward takes {self.facts.forward_s * 1e3:.0f} ms{busy}): the least useful "
                f"run needs about {clock(least)} (m:s); give --budget {int(least // 60) + 1}m "
                "or more"
            )

    def _drop_untrainable(self) -> None:
        """Head kinds that cannot be trained here, or not in the time the plan gives them,
        are dropped (with the command that trains them), and the plan made without them."""
        while True:
            planned = plan.training_planned(self.facts, self.evidence, self.seconds_left())
            untrainable = plan.cannot_train(self.facts, planned, self.evidence)
            if untrainable is None:
                return
            kinds, why_not = untrainable
            for name, kind in self.facts.train.items():
                if kind in kinds and name not in self.evidence.skipped:
                    self.skip(
                        name,
                        f"{why_not}: train {kind} heads with `autotune heads train --kind "
                        f"{kind} --model {self.ws.ref.spec}` (profile finds them in its heads "
                        "cache)",
                    )

    # --- the phases ------------------------------------------------------------------

    def tune(self) -> dict[str, MethodSettings]:
        """Answers, probes, training and tuning: every contender's setting, chosen on the
        search split."""
        for name, why in self.setup.skipped.items():
            say(f"[yellow]{name} skipped: {why}[/yellow]")
        if self.facts.answer_prompts:
            self.answers()
        for method in self._methods():
            if method.name not in self.evidence.skipped:
                self.probe(method)
        # with a leader known, its study comes first: a kind the rest cannot train
        # usefully is dropped now, its time going to the leader
        self._drop_untrainable()
        tuned: dict[str, MethodSettings] = {}
        lead = self.evidence.lead
        if lead is not None and lead.method not in self.evidence.skipped:
            tuned[lead.method] = self.tune_method(registry.method(lead.method))
            # what the leader's study left may no longer train a kind usefully
            self._drop_untrainable()
        kinds = self._kinds_left()
        if kinds and self.facts.extra_answer_prompts:
            extras = self.extra_answers()
        else:
            extras = []
        for kind in kinds:
            self.train(kind, extras)
        for method in self._methods():
            if method.name not in self.evidence.skipped and method.name not in tuned:
                tuned[method.name] = self.tune_method(method)
        return self.fit_expansions(tuned)

    def _methods(self) -> list[Method]:
        return [registry.method(name) for name in self.facts.methods]

    def _kinds_left(self) -> list[str]:
        return list(
            dict.fromkeys(
                kind for name, kind in self.facts.train.items() if name not in self.evidence.skipped
            )
        )

    def answers(self) -> None:
        """The target's greedy answers to the search prompts: what every proxy replays,
        and what heads train on."""
        from autotune.training.job import decode_calibration

        seconds = self.begin("answers").seconds
        answered = decode_calibration(
            self.ws.target,
            self.ws.prompts_path,
            self.ws.prompts,
            plan.ANSWER_TOKENS,
            seconds,
            extras=False,
            first_estimate=(plan.answers_seconds(self.facts, 1), plan.LEAST_ANSWERS),
        )
        self.end(answered.text())

    def extra_answers(self) -> list:
        from autotune.training.job import decode_calibration

        seconds = self.begin("extra answers").seconds
        answered = decode_calibration(
            self.ws.target, self.ws.prompts_path, self.ws.prompts, plan.ANSWER_TOKENS, seconds
        )
        self.end(answered.text())
        return answered.extras

    def probe(self, method: Method) -> None:
        """Cheap evidence on ``method``: a bound, and for a draft-free one a first
        measurement; a method whose bound cannot beat the leader is skipped."""
        name = method.name
        if name not in self.facts.train and type(method).probe is Method.probe:
            return  # nothing cheap to learn: it is tuned
        budget = self.begin(f"probe {name}")
        if name in self.facts.train:
            found = self._probe_heads(name, budget)
        else:
            found = method.probe(self._context(method, budget))
        if found is None:
            self.end("nothing")
            return
        self.evidence.bounds[name] = found.bound
        # a lead needs an interval worth the name (a probe cut short by time has none)
        if found.measured is not None and len(found.measured.prompts) >= MIN_PROMPTS:
            interval = found.measured.interval()
            lead = plan.Lead(
                name,
                found.measured.speedup,
                interval.low,
                interval.high,
                len(found.measured.prompts),
            )
            if self.evidence.lead is None or lead.low > self.evidence.lead.low:
                self.evidence.lead = lead
            say(f"{name} leads: {interval_text(found.measured)} on {lead.prompts} search prompts")
        self.end(f"bound {found.bound.speedup:.3f}x")
        say(f"{name}: at most {found.bound.speedup:.3f}x ({found.bound.evidence})")
        # the leader may have changed: every bound is weighed against it again (methods
        # the user named with --methods are tuned whatever their bound: it is only said)
        for other, bound in self.evidence.bounds.items():
            why = plan.skip_reason(bound, self.evidence.lead, self.request.margin)
            if why is None or other in self.evidence.skipped:
                continue
            if self.request.methods is None:
                self.skip(other, why)
            elif other == name:
                say(f"[yellow]{other} is tuned as asked, though {why}[/yellow]")

    def _probe_heads(self, name: str, budget: Budget):
        from autotune.methods.base import Probe
        from autotune.training.job import probe_kind

        kind = self.facts.train[name]
        full = plan.training_planned(self.facts, self.evidence, self.seconds_left()).get(kind, 0.0)
        try:
            found = probe_kind(self.ws, plan.ANSWER_TOKENS, kind, max(budget.seconds or 0.0, 1.0))
        except AutotuneError as exc:  # e.g. too few answers to train on
            self.skip(name, f"its {kind} heads could not be trained: {exc}")
            return None
        bound = plan.heads_bound(
            name,
            found.top1,
            found.top5,
            self.facts.verify_relative,
            found.trained_s,
            full,
            found.level_s / self.facts.forward_s,
        )
        return Probe(bound)

    def train(self, kind: str, extras: list) -> None:
        from autotune.training.job import train_kind

        names = [n for n, k in self.facts.train.items() if k == kind]
        seconds = self.begin(f"train {kind} heads").seconds
        try:
            folder = train_kind(self.ws, extras, plan.ANSWER_TOKENS, kind, seconds)
        except AutotuneError as exc:  # e.g. too few answers fitted the time to train on
            for name in names:
                self.skip(name, f"its {kind} heads could not be trained: {exc}")
            self.end("nothing")
            return
        self.heads.update(dict.fromkeys(names, folder))
        self.evidence.trained.add(kind)
        self.end(f"{kind} heads")

    def _context(self, method: Method, budget: Budget) -> TuneContext:
        return TuneContext(
            self.ws,
            self.setup.spaces[method.name],
            budget,
            self.request.workers,
            self.heads.get(method.name),
            self.request.trials,
            max_new_tokens=self.request.max_new_tokens,
            engines=self.request.engines,
        )

    def tune_method(self, method: Method) -> MethodSettings:
        share = self.begin(f"tune {method.name}")
        if self.request.time_budget_s is not None:
            share = Budget(self.request.time_budget_s)
        say(f"{method.name}: {method.title}")
        ctx = self._context(method, share)
        settings = method.tune(ctx)
        self.end(_bought(settings))
        return settings.model_copy(update={"notes": settings.notes + ctx.notes})

    def fit_expansions(self, tuned: dict[str, MethodSettings]) -> dict[str, MethodSettings]:
        chains = [m for m in self._methods() if m.chain and m.name in tuned]
        if not chains or not self.setup.expansions:
            return tuned
        budget = self.begin("fit CAPE")
        fitted = fit_expansions(self.setup, self.ws, tuned, budget, chains, self.heads)
        self.end(f"CAPE for {', '.join(m.name for m in chains)}")
        return fitted


def _bought(settings: MethodSettings) -> str:
    """What a method's tuning bought: its measured trials, as far as it says."""
    search = settings.search or {}
    trials = search.get("measured_trials")
    if isinstance(trials, list):
        return f"{len(trials)} measured trials"
    for key in ("mask_trials", "exit_trials", "trials"):
        if isinstance(search.get(key), int):
            return f"{search[key]} {key.replace('_', ' ')}"
    return "a setting"


def tune_methods(
    setup: Setup, ws: Workspace, request: ProfileRequest, schedule: Schedule
) -> dict[str, MethodSettings]:
    """Each method's setting, chosen on the search split within ``schedule``'s phases
    (for scripts that tune without a whole profile's plan: ``tuning_schedule``)."""
    tuned = {}
    for method in setup.methods:
        share = schedule.begin(f"tune {method.name}")
        ctx = TuneContext(
            ws,
            setup.spaces[method.name],
            share if request.time_budget_s is None else Budget(request.time_budget_s),
            request.workers,
            setup.heads.get(method.name),
            request.trials,
            engines=request.engines,
        )
        settings = method.tune(ctx)
        tuned[method.name] = settings.model_copy(update={"notes": settings.notes + ctx.notes})
    return tuned


def fit_expansions(
    setup: Setup,
    ws: Workspace,
    tuned: dict[str, MethodSettings],
    budget: Budget,
    chains: list[Method] | None = None,
    heads: dict[str, Path] | None = None,
) -> dict[str, MethodSettings]:
    """The tuned settings with CAPE fitted for every chain method, on the search split
    (``select`` decides whether the method keeps it). ``heads``: each head method's
    folder, those trained in this run included (default: the setup's)."""
    from autotune.methods.cape.fit import fit

    chains = chains if chains is not None else [m for m in setup.methods if m.chain]
    heads = heads if heads is not None else setup.heads
    out = dict(tuned)
    for expansion in setup.expansions:
        for method in chains:
            ctx = TuneContext(
                ws,
                setup.spaces[expansion.name],
                budget.part(plan.CAPE_FIT_SHARE),
                Workers(),
                heads.get(method.name),
                base_space=setup.spaces[method.name],
            )
            cape = fit(method, out[method.name], ctx)
            out[method.name] = out[method.name].model_copy(update={"cape": cape})
    return out


@dataclass
class Selection:
    """What the race on search prompts decided: the methods ranked (fastest first), their
    settings with the race's figures, and the methods it dropped, with why."""

    ranking: list[str]
    tuned: dict[str, MethodSettings]
    dropped: dict[str, str] = field(default_factory=dict)
    stopped: str = ""


def select(
    ws: Workspace, tuned: dict[str, MethodSettings], request: ProfileRequest, budget: Budget
) -> Selection:
    """Every method's final candidates (a chain method with and without its fitted
    expansion) race on search prompts within ``budget`` (``measure.race``): the clearly
    slower drop out round by round. The methods ranked by the candidate they keep, with
    the race's figures (each chain method keeps CAPE where that candidate was faster and
    still in the race). A lone candidate that measured itself against greedy while
    tuning keeps those figures."""
    from autotune.measure.race import race
    from autotune.measure.timing import SideBySide

    env = DraftEnv(ws.ref, ws.runner)
    variants = {
        name: candidate
        for method_name, settings in tuned.items()
        for name, candidate in candidates(method_name, settings, env).items()
    }
    if len(variants) == 1:  # nothing to choose between: the held-back measurement judges it
        return Selection(list(tuned), dict(tuned))
    prompts = spread(ws.encode(ws.search_prompts()), request.select_prompts)
    session = SideBySide(ws.runner, variants, request.max_new_tokens)
    with step(
        "selection: the candidates race side by side (search prompts)",
        len(prompts) * len(variants),
    ) as advance:
        result = race(session, prompts, 1.0 + request.margin, budget, on_prompt=lambda _: advance())
    if not any(m.prompts for m in result.measurements.values()):
        say("no time was left for the race: every method goes on to the held-back measurement")
        return Selection(list(tuned), dict(tuned), stopped=result.stopped)
    figures, kept, dropped = {}, {}, {}
    for name, settings in tuned.items():
        kept[name], figures[name] = keep_faster(settings, name, result.measurements, result.alive)
        names = candidates_of(name, settings)
        if not any(c in result.alive for c in names):
            # a method with CAPE raced twice: say which figure is which
            dropped[name] = "; ".join(
                result.dropped[c] if len(names) == 1 else f"{c}: {result.dropped[c]}" for c in names
            )
    ranking = sorted(kept, key=lambda n: (n in dropped, -figures[n].speedup))
    say(
        "on search prompts: "
        + ", ".join(f"{n} {interval_text(figures[n].model_dump())}" for n in ranking)
        + f" (race {result.stopped} after {result.looks} looks)"
    )
    for name, why in dropped.items():
        say(f"{name} dropped from the race: {why}")
    return Selection(ranking, kept, dropped, result.stopped)


def candidates_of(name: str, settings: MethodSettings) -> list[str]:
    """The names ``candidates`` gives a method's variants."""
    return [name, f"{name}+cape"] if getattr(settings, "cape", None) is not None else [name]


def candidates(name: str, settings: MethodSettings, env: DraftEnv) -> dict[str, Variant]:
    method = registry.method(name)
    cape = getattr(settings, "cape", None)
    if cape is None:
        return {name: method.variant(settings, env)}
    without = settings.model_copy(update={"cape": cape.model_copy(update={"enabled": False})})
    with_cape = settings.model_copy(update={"cape": cape.model_copy(update={"enabled": True})})
    return {name: method.variant(without, env), f"{name}+cape": method.variant(with_cape, env)}


def keep_faster(
    settings: MethodSettings,
    name: str,
    measured: dict[str, Measurement],
    alive: list[str] | None = None,
) -> tuple[MethodSettings, Figures]:
    """The settings with the faster of their candidates (of those still ``alive`` in a
    race, where one is), and its selection figures."""
    cape = getattr(settings, "cape", None)
    chosen = name
    if cape is not None:
        both = [name, f"{name}+cape"]
        left = [c for c in both if alive is None or c in alive] or both
        enabled = max(left, key=lambda c: measured[c].speedup) == f"{name}+cape"
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


def spread(prompts: list[EncodedPrompt], count: int) -> list[EncodedPrompt]:
    """``count`` prompts taken evenly through the list (files group prompts by category)."""
    if count >= len(prompts):
        return list(prompts)
    return [prompts[i * len(prompts) // count] for i in range(count)]


# --- the held-back measurement and the verdict ------------------------------------------


def measure_held_back(
    ws: Workspace,
    selection: Selection,
    request: ProfileRequest,
    noise: NoiseRecord,
    budget: Budget,
) -> HeldBack:
    """The finalists the race left (the leader alone where it decided) against one plain
    greedy decoding per prompt, interleaved, on held-back prompts, until the interval of
    the method ranked first decides against the bound (or the prompts run out): the
    figures reported. With no finalist, the method ranked first is measured, for the
    report."""
    from autotune.measure.sequential import measure_until_decided
    from autotune.measure.timing import SideBySide

    tuned, ranking = selection.tuned, selection.ranking
    if not tuned:
        return HeldBack({}, 0, "no method")
    bound = 1.0 + request.margin
    contenders = [n for n in finalists(tuned, ranking, bound) if n not in selection.dropped]
    env = DraftEnv(ws.ref, ws.runner)
    variants = {
        name: registry.method(name).variant(tuned[name], env) for name in contenders or ranking[:1]
    }
    prompts = heldback(ws, request)
    session = SideBySide(ws.runner, variants, request.max_new_tokens)
    with step(
        f"held-back measurement: {', '.join(variants)} against plain greedy",
        len(prompts) * len(variants),
    ) as advance:
        result = measure_until_decided(
            session,
            prompts,
            contenders[0] if contenders else None,
            bound,
            budget,
            between=lambda: noise.during.append(probe(ws.runner)),
            on_prompt=lambda _: advance(),
            deadline=ws.deadline,  # the run's: its least prompts too stop there
        )
    return HeldBack(result.measurements, result.looks, result.stopped, len(prompts))


def heldback(ws: Workspace, request: ProfileRequest) -> list[EncodedPrompt]:
    """The held-back prompts the run measures on (``--heldback-prompts`` of them)."""
    return ws.encode(ws.heldback_prompts()[: request.heldback_prompts])


ENGINE_MARK = "@"


def engine_settings_to_measure(tuned: dict[str, MethodSettings], recommended: str) -> bool:
    """Whether the recommended method has engine settings of its own left to measure."""
    settings = tuned.get(recommended)
    return settings is not None and any(
        not served_as_tuned(settings, v) for v in settings.engines.values()
    )


def measure_engine_settings(
    ws: Workspace,
    tuned: dict[str, MethodSettings],
    recommended: str,
    held: HeldBack,
    request: ProfileRequest,
    keep_s: float = 0.0,
) -> HeldBack:
    """After the verdict, in the time the run has left (less ``keep_s``, the time planned
    for the phase after it): the recommended method as each engine serves it, against
    plain greedy on the held-back prompts the verdict was measured on; reported per
    engine, not judged (the verdict's measurement stays its own, undiluted)."""
    from autotune.measure.timing import measure_variants

    left = ws.deadline.left() if ws.deadline is not None else None
    left = None if left is None else left - keep_s
    if left is not None and left < plan.ENGINE_SETTINGS_MIN_S:
        say("no time was left to measure the engines' own settings held back")
        return held
    # its own time: what the run has left, less a margin for writing the profile
    budget = Budget(None if left is None else left - plan.ENGINE_SETTINGS_MARGIN_S)
    variants = engine_variants(recommended, tuned[recommended], DraftEnv(ws.ref, ws.runner))
    measured_on = max((len(m.prompts) for m in held.measured.values()), default=0)
    prompts = heldback(ws, request)[: max(measured_on, 1)]
    label = f"held back: {recommended} as {', '.join(tuned[recommended].engines)} serve it"
    with step(label, len(prompts) * len(variants)) as advance:
        measured = measure_variants(
            ws.runner,
            variants,
            prompts,
            request.max_new_tokens,
            on_prompt=lambda _: advance(),
            until=budget,
            least=0,
        )
    return HeldBack({**held.measured, **measured}, held.looks, held.stopped, held.planned)


def measure_load(
    ws: Workspace,
    tuned: dict[str, MethodSettings],
    recommended: str,
    held: HeldBack,
    request: ProfileRequest,
) -> dict[str, MethodSettings]:
    """After the verdict, in the time the run has left: the recommended method with
    several requests in flight (``tuners.load_schedule``), level by level."""
    from autotune.tuners.load_schedule import fit_schedule

    settings = tuned[recommended]
    method = registry.method(recommended)
    candidates = method.load_settings(settings)
    env = DraftEnv(ws.ref, ws.runner)
    greedy = held.measured.get(recommended)
    tokens = min(plan.LOAD_TOKENS, request.max_new_tokens)
    first_level_s = None
    proven = frozenset({1})  # the verdict: clearly faster one request at a time
    if greedy is not None and greedy.baseline_tokens_per_s > 0 and request.concurrency:
        # the first level's runs, each round two requests
        runs = plan.load_level_runs(len(candidates), min(request.concurrency) in proven)
        first_level_s = runs * plan.LOAD_ROUNDS * 2 * tokens / greedy.baseline_tokens_per_s

    def seconds_left() -> float | None:
        left = ws.deadline.left() if ws.deadline is not None else None
        return None if left is None else left - plan.ENGINE_SETTINGS_MARGIN_S

    fitted = fit_schedule(
        ws.runner,
        {label: method.variant(s, env).make for label, (_, s) in candidates.items()},
        {label: cap for label, (cap, _) in candidates.items()},
        in_turn(ws.encode(ws.search_prompts())),
        in_turn(heldback(ws, request)),
        tokens,
        list(request.concurrency),
        plan.LOAD_ROUNDS,
        seconds_left,
        first_level_s,
        on_level=lambda line: say(f"[dim]under load, {line}[/dim]"),
        proven=proven,
    )
    if fitted.skipped:
        say(
            f"no time was left to measure concurrency {', '.join(map(str, fitted.skipped))}: "
            "give a longer --budget, or `autotune bench --concurrency` afterwards"
        )
    load = Load(
        levels=[load_level(level.held, level.pick, level.cap) for level in fitted.levels],
        crossover=fitted.crossover,
        skipped=fitted.skipped,
        max_new_tokens=tokens,
    )
    return {**tuned, recommended: settings.model_copy(update={"load": load})}


def load_level(held: LevelResult, pick: str, cap: int | None) -> LoadLevel:
    """One level's profile block: the pick's held-back figures (off: plain decoding's
    own, a speedup of exactly 1) beside the tuned setting's."""
    tuned = held.figures[TUNED].summary()
    figure = held.figures.get(pick)
    if figure is None:  # off: plain decoding's own figures
        chosen = {
            **tuned,
            "speedup": 1.0,
            "speedup_interval": None,
            "tokens_per_s": tuned["baseline_tokens_per_s"],
            "latency_s": tuned["baseline_latency_s"],
        }
    else:
        chosen = {**figure.summary(), "lossless": figure.lossless and tuned["lossless"]}
    return LoadLevel(
        concurrency=held.concurrency,
        setting=pick,
        max_draft_tokens=cap,
        tuned_speedup=tuned["speedup"],
        tuned_interval=tuned["speedup_interval"],
        rounds=held.rounds,
        **chosen,
    )


def in_turn(prompts: list[EncodedPrompt]) -> list[list[int]]:
    """Token ids with the categories in turn: each round of a level holds several."""
    return [p.ids for p in categories_in_turn(prompts, len(prompts))]


def load_summary(load: Load | None) -> str:
    """One line on a schedule under load: each level's setting and speedup."""
    if load is None or not load.levels:
        return "no level measured"
    parts = [f"{lv.concurrency}: {lv.setting} {lv.speedup:.2f}x" for lv in load.levels]
    crossing = f"; off from {load.crossover}" if load.crossover else ""
    return ", ".join(parts) + crossing


def engine_variants(name: str, settings: MethodSettings, env: DraftEnv) -> dict[str, Variant]:
    """``name``'s setting as each engine with a variant of its own serves it, distinct
    ones once, named ``method@engine[,engine]``."""
    method = registry.method(name)
    by_setting: dict[str, list[str]] = {}
    for engine, variant in settings.engines.items():
        if not served_as_tuned(settings, variant):  # else: the method's own figures
            by_setting.setdefault(repr(sorted(variant.setting.items())), []).append(engine)
    return {
        f"{name}{ENGINE_MARK}{','.join(engines)}": method.variant(
            method.for_engine(settings, engines[0]), env
        )
        for engines in by_setting.values()
    }


def _selection_speedup(settings: MethodSettings) -> float:
    return settings.selection.speedup if settings.selection is not None else 0.0


def finalists(tuned: dict[str, MethodSettings], ranking: list[str], bound: float) -> list[str]:
    """The methods still in the running after the selection: those whose search-prompt
    interval reaches above ``bound`` (best first); every method, when none has search
    figures (a lone method is not raced; a race may have had no time)."""
    if all(tuned[name].selection is None for name in ranking):
        return list(ranking)  # undecided, all of them
    out = []
    for name in ranking:
        selection = tuned[name].selection
        if selection is None:
            continue
        high = (selection.speedup_interval or [selection.speedup] * 2)[1]
        if high > bound:  # not clearly below the bar: still undecided
            out.append(name)
    return out


def simultaneous_interval(measured: Measurement, among: int):
    """The speedup's interval allowing for its looks and for ``among`` finalists compared
    at once (Bonferroni): what a choice between them may be read off."""
    from autotune.measure.stats import CONFIDENCE, bootstrap_interval, look_confidence

    return bootstrap_interval(
        measured.pairs(), look_confidence(CONFIDENCE, max(1, measured.looks) * max(1, among))
    )


def decide(
    tuned: dict[str, MethodSettings],
    ranking: list[str],
    held: HeldBack,
    margin: float,
    skipped: dict[str, str] | None = None,
) -> Verdict:
    """The fastest finalist on the held-back prompts whose simultaneous interval (over
    the finalists and the looks) clears 1 + margin and whose output matched greedy is
    recommended; otherwise none, with the reason. ``skipped``: the methods not run, with
    why; the verdict keeps them."""
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
    chosen = [n for n in finalists(tuned, ranking, bound) if held.measured.get(n)]
    chosen = [n for n in chosen if held.measured[n].prompts]
    if not chosen:
        top = ranking[0]
        verdict.reason = (
            f"no method was faster than plain greedy decoding on the search "
            f"prompts (the fastest, {top}, ran at "
            f"{_selection_speedup(tuned[top]):.3f}x)"
        )
        return verdict
    among = len(chosen)
    rows = {n: (held.measured[n], simultaneous_interval(held.measured[n], among)) for n in chosen}
    scope = f" (simultaneous over {among} finalists)" if among > 1 else ""

    def text(name: str) -> str:
        measured, interval = rows[name]
        return (
            f"{name} measured {measured.speedup:.3f}x [{interval.low:.3f}, {interval.high:.3f}]"
            f"{scope} on {len(measured.prompts)} held-back prompts"
        )

    clear = [n for n in chosen if rows[n][0].lossless is not False and rows[n][1].above(bound)]
    lossy = [n for n in chosen if rows[n][0].lossless is False]
    measured_prompts = max(len(held.measured[n].prompts) for n in chosen)
    if measured_prompts < min(MIN_PROMPTS, held.planned):
        # the run's deadline came first: too few prompts for an interval to prove
        verdict.reason = (
            "; ".join(text(n) for n in chosen)
            + f": the budget ran out after {measured_prompts} of "
            f"{held.planned} held-back prompts, and fewer than {MIN_PROMPTS} prove nothing; "
            "give more --budget"
        )
    elif clear:
        best = max(clear, key=lambda n: rows[n][0].speedup)
        verdict.recommended = best
        verdict.reason = f"{text(best)}: its interval lies above {bound:.2f}"
    elif lossy and len(lossy) == len(chosen):
        verdict.reason = f"{text(lossy[0])}, but its output differed from plain greedy decoding"
    else:
        verdict.reason = "; ".join(text(n) for n in chosen) + (f": no interval clears {bound:.2f}")
    return verdict


def assemble(
    ws: Workspace,
    tuned: dict[str, MethodSettings],
    held: HeldBack,
    verdict: Verdict,
    noise: NoiseRecord,
    request: ProfileRequest,
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


def served_as_tuned(settings: MethodSettings, variant: EngineVariant) -> bool:
    """Whether an engine's own setting is the method's setting itself (the chosen one)."""
    return variant.setting in settings.model_dump(exclude={"engines"}).values()


def with_engine_figures(
    blocks: dict[str, MethodSettings], measured: dict[str, Measurement]
) -> dict[str, MethodSettings]:
    """The blocks with their engine settings' held-back figures (``method@engine,...``;
    an engine served the method's setting itself shares the method's)."""
    out = dict(blocks)
    for name, block in blocks.items():
        if name in measured and measured[name].prompts:
            own = {
                e: v.model_copy(update={"measured": block.measured})
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
            e: v.model_copy(update={"measured": figures}) if e in engines.split(",") else v
            for e, v in out[name].engines.items()
        }
        out[name] = out[name].model_copy(update={"engines": own})
    return out


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
        lines += engine_lines(name, method)
        lines += load_lines(name, method.load)
    if profile.verdict is not None:
        lines += [f"{name} skipped: {why}" for name, why in profile.verdict.skipped.items()]
        lines += [
            f"{name} dropped from the selection race: {why}"
            for name, why in profile.verdict.dropped.items()
        ]
        lines += time_lines(profile.verdict.time)
    noise = profile.environment.noise if profile.environment else {}
    if noise.get("busy"):
        lines.append(f"the machine was busy while timing: {'; '.join(noise['reasons'])}")
    low, high = noise.get("forward_ms_range") or (0.0, 0.0)
    if low and high / low > SPEED_CHANGE_SAID:
        lines.append(
            f"the machine's speed changed {high / low:.1f}x during the run (one forward "
            f"{low:.0f}-{high:.0f} ms): timing is interleaved, so the ratios hold, but "
            "fewer prompts fitted in the time"
        )
    verdict = profile.verdict
    reason = f" ({verdict.reason})" if verdict is not None else ""
    lines.append(f"recommended: {profile.recommended}{reason}")
    return lines


def load_lines(name: str, load: Load | None) -> list[str]:
    """Speedup against concurrency: per level, the setting chosen and its held-back
    throughput speedup, beside the tuned setting's; the crossover."""
    if load is None:
        return []
    lines = []
    for level in load.levels:
        chosen = (
            "off (plain decoding)"
            if level.setting == "off"
            else f"{level.setting}: {interval_text(level.model_dump())}"
        )
        tuned = f"{level.tuned_speedup:.3f}x" if level.tuned_speedup is not None else "-"
        lines.append(
            f"{name} with {requests_text(level.concurrency)} in flight: {chosen} "
            f"({level.tokens_per_s:.1f} vs {level.baseline_tokens_per_s:.1f} tokens/s; the "
            f"tuned setting {tuned}; {level.rounds} rounds held back)"
        )
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


def _proven(level: LoadLevel) -> bool:
    """Held back, the level's interval lies above plain decoding (off needs no proof)."""
    if level.setting == "off":
        return True
    interval = level.speedup_interval
    return interval is not None and interval[0] > 1.0


def engine_lines(name: str, method: MethodSettings) -> list[str]:
    """The method as each engine serves it (its own rule and options): the figures the
    export to that engine carries."""
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
            said = f"{interval_text(figures.model_dump())} on {figures.prompts} {where}"
        lines.append(f"{name} in {engine}: {variant.description}: {said}")
    return lines


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
