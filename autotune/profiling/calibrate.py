"""The run's first phases: the model and prompts opened, the machine checked, the facts
the plan is made from measured, and the target's own greedy answers decoded (what every
proxy replays and what heads learn from)."""

from __future__ import annotations

from collections.abc import Callable

from autotune import plan
from autotune.budget import Budget
from autotune.measure.noise import NoiseRecord, fewer_threads, probe, settle
from autotune.profile.io import check_writable
from autotune.profiling import state
from autotune.profiling.request import Measuring, ProfileRequest, Tuning
from autotune.profiling.setup import Setup
from autotune.profiling.state import RunState
from autotune.progress import say
from autotune.workspace import Workspace


def open_workspace(request: ProfileRequest) -> Workspace:
    from autotune.models.ref import TargetRef

    if request.out is not None:
        check_writable(request.out)
    ref = TargetRef.for_user(request.model, request.model_path, request.dtype, request.device)
    ws = Workspace.open(ref, request.prompts, request.storage)
    ws.check_context(max(request.max_new_tokens, plan.ANSWER_TOKENS))
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
    setup: Setup,
    ws: Workspace,
    measuring: Measuring,
    budget_s: float | None = None,
    named: bool = False,
) -> plan.Facts:
    """What the plan is made from: this machine's forward time and verify curve, the
    methods in the order they run (draft-free first, head methods last), and what the
    answers phase has to decode. ``named``: the user named the methods."""
    from autotune.training.calibration import answered, calibration_extras, search_thirds
    from autotune.training.kinds import KINDS
    from autotune.workspace import SHARED_CURVE_TOKENS

    order = sorted(setup.methods, key=lambda m: (m.heads is not None, not m.draft_free))
    curve = ws.verify_curve(plan.PROBE_CURVE_TOKENS)
    # the same measured curve's longest forward (cached with it): what training runs at
    per_token = ws.verify_curve(SHARED_CURVE_TOKENS)(SHARED_CURVE_TOKENS) / SHARED_CURVE_TOKENS
    trained, unseen, _ = search_thirds(ws.prompts)
    search = trained + unseen
    missing = len(search) - len(answered(ws.target, plan.ANSWER_TOKENS)(search))
    expansion = setup.expansions[0].label if setup.expansions else ""
    return plan.Facts(
        forward_s=curve(1),
        verify_relative=tuple(curve.relative()),
        methods=tuple(m.name for m in order),
        draft_free=tuple(m.name for m in order if m.draft_free),
        train=dict(setup.train),
        min_training={k: KINDS[k].least_training_s(per_token) for k in set(setup.train.values())},
        chain_methods=tuple(m.name for m in setup.methods if m.chain) if expansion else (),
        expansion=expansion,
        leader_tuning_s={
            m.name: seconds
            for m in order
            if (seconds := m.tuning_seconds(setup.spaces[m.name], curve(1), plan.LEADER_TRIALS))
        },
        answer_prompts=missing,
        extra_answer_prompts=len(calibration_extras(ws.prompts_path)) if setup.train else 0,
        heldback_prompts=min(measuring.heldback_prompts, len(ws.heldback_prompts())),
        heldback_tokens=measuring.max_new_tokens,
        select_prompts=measuring.select_prompts,
        params=sum(p.numel() for p in ws.target.model.parameters()),
        cpu=ws.runner.device.type == "cpu",
        budget_s=budget_s,
        load_levels=len(measuring.concurrency),
        named=named,
    )


def start(
    setup: Setup,
    ws: Workspace,
    tuning: Tuning,
    measuring: Measuring,
    budget: Budget,
    noise: NoiseRecord,
    planned: Callable[[RunState], RunState] = lambda run: run,
) -> RunState:
    """The run's state at its start: the facts measured (``planned`` adds the phases the
    request asks for beyond the methods', such as a serving engine's measurement, so that
    the first plan said holds them), a budget too small for the least useful run refused,
    head kinds that cannot be trained in time dropped, the plan said."""
    run = RunState(
        setup=setup,
        ws=ws,
        tuning=tuning,
        budget=budget,
        facts=measure_facts(setup, ws, measuring, budget.seconds, tuning.named),
        evidence=plan.Evidence(skipped=dict(setup.skipped)),
        noise=noise,
        heads=dict(setup.heads),
    )
    run = planned(run)
    state.refuse_small_budget(run)
    run = state.drop_untrainable(run)
    for line in state.schedule(run).lines():
        say(line)
    for name, why in setup.skipped.items():
        say(f"[yellow]{name} skipped: {why}[/yellow]")
    return run


def calibrate(run: RunState) -> RunState:
    """The target's greedy answers to the search prompts not answered yet."""
    if run.facts.answer_prompts:
        run, _ = answers(run)
    return run


@state.phase(lambda run: "answers")
def answers(run: RunState, budget: Budget) -> tuple[RunState, None, str]:
    """The target's greedy answers to the search prompts: what every proxy replays, and
    what heads train on."""
    answered = _decode_answers(
        run,
        budget,
        extras=False,
        first_estimate=(plan.answers_seconds(run.facts, 1), plan.LEAST_ANSWERS),
    )
    return run, None, answered.text()


@state.phase(lambda run: "extra answers")
def extra_answers(run: RunState, budget: Budget) -> tuple[RunState, list, str]:
    """Answers to the packaged calibration prompts too: more for heads to learn from."""
    answered = _decode_answers(run, budget)
    return run, answered.extras, answered.text()


def _decode_answers(run: RunState, budget: Budget, **options):
    """The workspace's answers ``plan.ANSWER_TOKENS`` long, decoded by its runner within
    ``budget`` (``calibration.decode_calibration``'s ``options``)."""
    from autotune.training.calibration import decode_calibration

    ws = run.ws
    return decode_calibration(
        ws.target,
        ws.runner,
        ws.prompts_path,
        ws.prompts,
        plan.ANSWER_TOKENS,
        budget.seconds,
        **options,
    )
