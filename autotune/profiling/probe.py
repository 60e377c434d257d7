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


def probe_all(run: RunState) -> RunState:
    """Every contender's probe, in the plan's order (draft-free first, head methods
    last), each bound weighed against the leader as it comes."""
    from autotune.methods import registry

    for method in (registry.method(name) for name in run.facts.methods):
        if method.name not in run.evidence.skipped and probes(method, run):
            run, _ = probe(run, method)
            run = weigh(run, method)
    return run


def probes(method: Method, run: RunState) -> bool:
    """Whether ``method`` has cheap evidence to gather (its heads are trained in the run,
    or it says how to probe it) that can change the run (``plan.probe_pays``); else it
    is tuned whatever the others measured."""
    facts = run.facts
    return (method.name in facts.train or method.probes) and plan.probe_pays(
        facts, method.name, run.evidence.contenders(facts)
    )


@state.phase(lambda run, method: f"probe {method.name}")
def probe(run: RunState, budget: Budget, method: Method) -> tuple[RunState, None, str]:
    """``method``'s probe: its bound, and for a draft-free one a first measurement that
    may make it the leader; every bound is then weighed against the leader again."""
    name = method.name
    if name in run.facts.train:
        run, found = _probe_heads(run, name, budget)
    else:
        found = method.probe(context(run, method, budget))
    if found is None:
        return run, None, "nothing"
    bounds = {**run.evidence.bounds, name: found.bound}
    run = _with_evidence(run, bounds=bounds, lead=_lead_after(run.evidence.lead, name, found))
    return run, None, f"bound {found.bound.speedup:.3f}x"


def weigh(run: RunState, method: Method) -> RunState:
    """After ``method``'s probe: its bound said, and every bound weighed against the
    leader, which may have changed (the methods the user named with --methods are tuned
    whatever their bound: it is only said)."""
    bound = run.evidence.bounds.get(method.name)
    if bound is None:
        return run
    say(f"{method.name}: at most {bound.speedup:.3f}x ({bound.evidence})")
    for other, bound in run.evidence.bounds.items():
        why = plan.skip_reason(bound, run.evidence.lead, run.tuning.margin)
        if why is None or other in run.evidence.skipped:
            continue
        if not run.tuning.named:
            run = state.skip(run, other, why)
        elif other == method.name:
            say(f"[yellow]{other} is tuned as asked, though {why}[/yellow]")
    return run


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
        run.tuning.workers,
        run.heads.get(method.name),
        run.tuning.trials,
        max_new_tokens=run.tuning.max_new_tokens,
        engines=run.tuning.engines,
    )


def _with_evidence(run: RunState, **changes) -> RunState:
    return dataclasses.replace(run, evidence=dataclasses.replace(run.evidence, **changes))
