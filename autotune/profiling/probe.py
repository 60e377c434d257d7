"""Each method's probe: cheap evidence before its expensive phases. A draft-free method
measures a first leader against greedy; the others get an optimistic bound, and a method
whose bound cannot beat the leader's lower bound is skipped."""

from __future__ import annotations

import dataclasses

from autotune import plan
from autotune.budget import Budget
from autotune.errors import AutotuneError
from autotune.measure.stats import MIN_PROMPTS
from autotune.measure.timing import interval_text
from autotune.methods.base import Method, Probe, TuneContext
from autotune.profiling import state
from autotune.profiling.state import RunState
from autotune.progress import say


def probe(run: RunState, method: Method) -> RunState:
    """``method``'s probe: its bound, and for a draft-free one a first measurement that
    may make it the leader; every bound is then weighed against the leader again."""
    name = method.name
    if name not in run.facts.train and type(method).probe is Method.probe:
        return run  # nothing cheap to learn: it is tuned
    run, phase = state.begin(run, f"probe {name}")
    if name in run.facts.train:
        run, found = _probe_heads(run, name, phase.budget)
    else:
        found = method.probe(context(run, method, phase.budget))
    if found is None:
        return state.end(run, phase, "nothing")
    bounds = {**run.evidence.bounds, name: found.bound}
    run = _with_evidence(run, bounds=bounds, lead=_lead_after(run.evidence.lead, name, found))
    run = state.end(run, phase, f"bound {found.bound.speedup:.3f}x")
    say(f"{name}: at most {found.bound.speedup:.3f}x ({found.bound.evidence})")
    return _weigh_bounds(run, name)


def _lead_after(lead: plan.Lead | None, name: str, found: Probe) -> plan.Lead | None:
    """The leader after ``name``'s probe: it leads where it measured against greedy, on
    enough prompts for an interval worth the name, with a higher lower bound."""
    if found.measured is None or len(found.measured.prompts) < MIN_PROMPTS:
        return lead  # a probe cut short by time has no interval to lead with
    interval = found.measured.interval()
    mine = plan.Lead(
        name, found.measured.speedup, interval.low, interval.high, len(found.measured.prompts)
    )
    say(f"{name} leads: {interval_text(found.measured)} on {mine.prompts} search prompts")
    return mine if lead is None or mine.low > lead.low else lead


def _weigh_bounds(run: RunState, probed: str) -> RunState:
    """Every bound weighed against the leader, which may have changed (the methods the
    user named with --methods are tuned whatever their bound: it is only said)."""
    for other, bound in run.evidence.bounds.items():
        why = plan.skip_reason(bound, run.evidence.lead, run.request.margin)
        if why is None or other in run.evidence.skipped:
            continue
        if run.request.methods is None:
            run = state.skip(run, other, why)
        elif other == probed:
            say(f"[yellow]{other} is tuned as asked, though {why}[/yellow]")
    return run


def _probe_heads(run: RunState, name: str, budget: Budget) -> tuple[RunState, Probe | None]:
    """A head method's probe: its heads trained for a slice of their time, bounded."""
    from autotune.training.job import probe_kind

    kind = run.facts.train[name]
    planned = plan.training_planned(run.facts, run.evidence, state.seconds_left(run))
    try:
        found = probe_kind(run.ws, plan.ANSWER_TOKENS, kind, max(budget.seconds or 0.0, 1.0))
    except AutotuneError as exc:  # e.g. too few answers to train on
        return state.skip(run, name, f"its {kind} heads could not be trained: {exc}"), None
    bound = plan.heads_bound(
        name,
        found.top1,
        found.top5,
        run.facts.verify_relative,
        found.trained_s,
        planned.get(kind, 0.0),
        found.level_s / run.facts.forward_s,
    )
    return run, Probe(bound)


def context(run: RunState, method: Method, budget: Budget) -> TuneContext:
    """What ``method`` probes and tunes with, within ``budget``."""
    return TuneContext(
        run.ws,
        run.setup.spaces[method.name],
        budget,
        run.request.workers,
        run.heads.get(method.name),
        run.request.trials,
        max_new_tokens=run.request.max_new_tokens,
        engines=run.request.engines,
    )


def _with_evidence(run: RunState, **changes) -> RunState:
    return dataclasses.replace(run, evidence=dataclasses.replace(run.evidence, **changes))
