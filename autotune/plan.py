"""The time plan of `autotune profile`: numbers in, phases out.

Pure: no model, no clock, no printing. ``profiling`` measures (this machine's forward
time and verify curve, what each phase found) and asks this module, after every phase,
what to do with the time left: which phases remain and their seconds, whether a method
can still win (its optimistic bound against the leader's lower bound), and the least
budget worth starting. Every share of the run's time is set here.

The order is cheapest evidence first: the shared answers of the search prompts; the
draft-free methods' probes (no training: they give the run its first leader and an
interval to beat); the other methods' probes (a skip mask scored on the proxy, a head
trained for a slice of its time); then only the methods whose bound can beat the leader
are trained and tuned, the leader's study taking the time the others left.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from autotune.schedule import Phase, clock

# --- the run's size --------------------------------------------------------------------
# The whole run (``--budget``): with set-up (about a minute on 2 cores), README command 1
# ends within 20 minutes (a 20-minute run ended at 19:09-19:18, 20:20 with set-up).
BUDGET_S = 18 * 60.0
# The held-back measurement: at most this many prompts (``--heldback-prompts``), of this
# many tokens each (``--max-new-tokens``); the selection race: at most this many search
# prompts, of as many tokens.
HELDBACK_PROMPTS = 16
HELDBACK_TOKENS = 128
SELECT_PROMPTS = 12  # the race's most: it stops sooner once one candidate is left
# The prompts the held-back measurement is planned for: its first look
# (``measure.sequential.FIRST_LOOK``; fewer when short of time, down to
# ``measure.stats.MIN_PROMPTS``), its later looks decoding more while it is undecided.
HELDBACK_PLANNED = 12
LEAST_INTERVAL_PROMPTS = 6
# A method is recommended when its held-back interval's low end clears 1 + MARGIN.
MARGIN = 0.0
# Heads are trained within the run on models up to this size on a CPU.
CPU_TRAINABLE_PARAMS = 1_000_000_000
# Heads trained within the run learn from answers this long (all trainers share them).
ANSWER_TOKENS = 128
# The fewest search prompts answered (the first chunk's least on a short budget).
LEAST_ANSWERS = 6
# Answers are decoded in batches: this many times faster than one sequence. By the
# engine's batched decoding (``distill.decode_answers``), 2 cores, 16 answers of 128
# tokens: 4.9x and 5.3x (6.8 s at 16.4 ms a forward, 7.7 s at 19.9 ms); a little under,
# for prompts longer than those. (transformers' generate, which decoded them before:
# about 3x.) On a GPU the batch's recorded steps cost little more than one sequence's.
BATCHED_DECODING_GAIN = 4.5

# --- the least seconds worth spending ---------------------------------------------------
# Every floor below which a step measures nothing useful, in one place (a head kind's own
# least training time is on its registry entry, ``training.kinds``).
# What a run keeps back from --budget for its ending: assembling and writing the profile
# and its plot, the report, the process's exit.
CLOSING_S = 10.0
# A run without --budget plans as if this much were left.
NO_BUDGET_S = 3600.0
# A study needs at the least: Ray's workers start and load the model, and a measured
# trial decodes a few prompts.
LEAST_STUDY_S = 20.0
# What a measured trial costs besides its decoding: Tune starting it, the drafter's
# warm-up (2 cores: whole trials took 19-22 s for 14 s of decoding, pruned 7-12 s for 6).
TRIAL_START_S = 1.5
# However long generation took, training gets at least this long (a profile's probe
# trains heads for ~30 s on answers already decoded: a longer floor overran it 2x).
LEAST_TRAINING_S = 20.0
# Head kinds, the likeliest to pay first: where the time left trains one of two kinds that
# need as long, the later one goes (EAGLE's heads lead Medusa's on Spec-Bench's published
# leaderboard, Vicuna-7B on one RTX 3090), not whichever a set happens to yield first.
HEADS_PRIOR = ("eagle", "medusa", "glide")

# --- shares of the time ------------------------------------------------------------------
# Decoding with a method costs about this much of greedy's time (for the plan only;
# measured on 2 cores: 0.71 to 1.23, 0.93 on average over four methods).
SPECULATIVE_COST = 0.95
# The selection and held-back measurement take at most this share of the budget: beyond
# it they measure fewer prompts.
MEASURE_SHARE = 0.35
# Of the time for training and tuning: training (when heads are trained), and of the
# training share, the answers to the packaged calibration prompts heads also learn from.
TRAINING_SHARE = 0.55
ANSWERS_SHARE = 0.35
# Of the searches' time, what fitting an expansion on the chain methods takes.
EXPANSION_SHARE = 0.15
# Of the time for training and tuning, the leader's study gets this much, first, when
# other methods are still to be tuned: on 2 cores an even split left the draft-free study
# 0:51, not one trial. More where the leader says it needs more to finish LEADER_TRIALS
# whole measured trials (``Method.tuning_seconds``), up to LEADER_MAX_SHARE.
LEADER_TUNING_SHARE = 0.5
LEADER_MAX_SHARE = 0.8
LEADER_TRIALS = 12
# A draft-free method decodes in about this much of greedy's time (the lookup on
# 2 cores: 1.15-1.3x at 64 tokens, about 1.0x on its first prompts).
DRAFT_FREE_COST = 0.9

# Within a method's tuning time, each step's share is the method's own: declared on its
# registry entry (``Entry.time_shares``).

# After the verdict, the recommended method's engine settings are measured held back in
# the time the run has left, when at least this much is left; the margin is kept for
# writing the profile.
ENGINE_SETTINGS_MIN_S = 30.0
ENGINE_SETTINGS_MARGIN_S = 15.0
# Then the recommended method under load (``tuners.load_schedule``), level by level while
# the time left allows: rounds of prompts per level, tokens per request, and the share of
# the budget kept for it (on 2 cores a level of SmolLM2-135M took 1-4 minutes at 4
# rounds, so 2 minutes of a 20-minute run buy the first one or two levels).
LOAD_ROUNDS = 4
LOAD_TOKENS = 64
LOAD_SHARE = 0.1
LOAD_CANDIDATES = 5  # the tuned setting and four caps (``Method.load_settings``)
# The held-back prompts decoded in a serving engine itself (``Facts.engine_decoders``):
# at most this share of the budget; its servers start in about ENGINE_START_S each.
ENGINE_SHARE = 0.1
ENGINE_START_S = 5.0

# --- probes and bounds ------------------------------------------------------------------
# The verify curve the bounds read (n = 1 .. this many tokens).
PROBE_CURVE_TOKENS = 16
# A draft-free method's probe: its proxy's best decoded against greedy on this many
# search prompts, as long as the verdict's: the run's first leader and its interval.
# (6 prompts gave the draft-free lookup [1.04, 1.46] on 2 cores: too loose a low end
# to skip by; four drafts of 64 tokens [1.05, 1.43], the choice among four widening it.)
PROBE_PROMPTS = 10
# The drafts it decodes beside greedy: each of the draft-free method's two kinds (a chain, a
# tree) at its proxy best.
DRAFT_FREE_PROBE_DRAFTS = 2
# At most this share of the training and tuning time (quiet 2 cores: 2:13 of about 11:30; beside
# three CPU hogs 10 prompts were planned 7:09 and left the studies nothing).
DRAFT_FREE_PROBE_SHARE = 0.2
# A head kind's probe trains for this share of its planned training (at least
# PROBE_LEAST_S); the rest of the training happens only if its bound can win.
PROBE_SHARE = 0.2
PROBE_LEAST_S = 25.0
# Optimistic learning curve: accuracy after t seconds grows at most as t ** EXPONENT
# (on 2 cores one parallel-heads kind's head-1 top-1 went 0.077 -> 0.115 from 60 s to
# 120 s: exponent 0.58), at most MAX_GROWTH-fold (heads of this size level off: a
# 6-epoch job reached top-1 0.134 where 120 s reached 0.115), capped at ACCURACY_CAP.
LEARNING_EXPONENT = 0.7
MAX_GROWTH = 3.0
ACCURACY_CAP = 0.95
# A search scored on its seeds only (a layer-skip mask on the proxy) may still find a
# setting this much faster than its best seed.
SEARCH_HEADROOM = 1.2


@dataclass(frozen=True)
class Facts:
    """What the plan is made from, measured once at the start."""

    forward_s: float  # one greedy forward (one new token) on this machine
    verify_relative: tuple[float, ...]  # verifying n tokens over one, n = 1, 2, ...
    methods: tuple[str, ...]  # to tune, in the order they run: draft-free first
    draft_free: tuple[str, ...] = ()  # those that need no training (their probe measures)
    train: dict[str, str] = field(default_factory=dict)  # method -> head kind to train
    min_training: dict[str, float] = field(default_factory=dict)  # kind -> least useful s
    chain_methods: tuple[str, ...] = ()  # those an expansion widens (empty: none asked)
    expansion: str = ""  # the expansion whose fitting phase this names
    answer_prompts: int = 0  # search prompts whose answers are not cached yet
    extra_answer_prompts: int = 0  # packaged calibration prompts heads may learn from
    heldback_prompts: int = HELDBACK_PROMPTS
    heldback_tokens: int = HELDBACK_TOKENS
    select_prompts: int = SELECT_PROMPTS
    params: int = 0
    cpu: bool = True
    # method -> seconds its tuning needs to finish LEADER_TRIALS whole trials, where the
    # method can say (what it gets, within LEADER_MAX_SHARE, when it leads)
    leader_tuning_s: dict[str, float] = field(default_factory=dict)
    # the whole run's seconds (None: no budget): what the measurements' share is of, so
    # that phases overrunning before them cannot shrink it
    budget_s: float | None = None
    load_levels: int = 0  # concurrency levels to measure after the verdict (--concurrency)
    # decoders measured held back in a serving engine itself (its greedy decoding and the
    # candidates; 0: none), where the user deploys to one that runs here
    engine_decoders: int = 0
    # the user named the methods (--methods): they are tuned whatever their bounds
    named: bool = False


@dataclass(frozen=True)
class Lead:
    """The method ahead so far, measured against greedy: speedup and interval."""

    method: str
    speedup: float
    low: float
    high: float
    prompts: int


@dataclass(frozen=True)
class Bound:
    """The most a method could reach in the time left, from what its probe measured."""

    method: str
    speedup: float
    evidence: str  # how it was reached, with the numbers


@dataclass(frozen=True)
class Evidence:
    """What the run has learned so far: the phases done, the leader, the bounds, the
    methods skipped (with why)."""

    done: set[str] = field(default_factory=set)
    lead: Lead | None = None
    bounds: dict[str, Bound] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    trained: set[str] = field(default_factory=set)  # head kinds trained in full

    def contenders(self, facts: Facts) -> list[str]:
        return [m for m in facts.methods if m not in self.skipped]


# --- bounds ------------------------------------------------------------------------------


def chain_speedup(
    acceptance: Sequence[float],
    verify_relative: Sequence[float],
    draft_relative: float = 0.0,
    width: int = 1,
) -> tuple[float, int]:
    """The best (speedup, depth) of a draft ``width`` tokens wide at each depth whose
    tokens at depth i hold the target's with probability ``acceptance[i]`` given the
    ones before: expected tokens per step over the step's cost (verifying
    1 + width x depth tokens, plus drafting ``depth`` levels at ``draft_relative`` of a
    forward each)."""
    best, depth_of_best = 1.0, 0
    expected, reach = 1.0, 1.0
    for depth, rate in enumerate(acceptance, 1):
        if width * depth >= len(verify_relative):
            break
        reach *= max(0.0, min(1.0, rate))
        expected += reach
        speedup = expected / (verify_relative[width * depth] + depth * draft_relative)
        if speedup > best:
            best, depth_of_best = speedup, depth
    return best, depth_of_best


def extrapolated_accuracy(accuracy: float, trained_s: float, full_s: float) -> float:
    """An optimistic accuracy after ``full_s`` seconds of training, from ``accuracy``
    measured after ``trained_s``: grown as time ** LEARNING_EXPONENT, at most
    MAX_GROWTH-fold (heads this small level off) and ACCURACY_CAP."""
    if trained_s <= 0:
        return ACCURACY_CAP
    growth = min(MAX_GROWTH, max(1.0, full_s / trained_s) ** LEARNING_EXPONENT)
    return min(ACCURACY_CAP, accuracy * growth)


def heads_bound(
    method: str,
    top1: Sequence[float],
    top5: Sequence[float],
    verify_relative: Sequence[float],
    trained_s: float,
    full_s: float,
    draft_relative: float = 0.0,
) -> Bound:
    """A head method's bound: the better of a chain accepted as often as each head's
    top-1 holds the target's token, and a tree five wide at every depth accepted as often
    as its top-5 does (priced at five tokens a depth), after the full training's
    optimistic growth, each depth drafted at ``draft_relative`` of a forward (one token
    wide: the tree's wider levels are charged as a chain's, optimistically)."""
    grown1 = [extrapolated_accuracy(a, trained_s, full_s) for a in top1]
    grown5 = [extrapolated_accuracy(a, trained_s, full_s) for a in top5]
    chain, chain_depth = chain_speedup(grown1, verify_relative, draft_relative)
    tree, tree_depth = chain_speedup(grown5, verify_relative, draft_relative, width=5)
    shape = f"a chain {chain_depth} deep" if chain >= tree else f"a tree 5 wide, {tree_depth} deep"
    drafting = (
        f"each depth drafted at {draft_relative:.2f} of a forward (measured)"
        if draft_relative
        else "drafted free"
    )
    return Bound(
        method,
        max(chain, tree),
        f"top-1 {', '.join(f'{a:.2f}' for a in top1)} and top-5 "
        f"{', '.join(f'{a:.2f}' for a in top5)} after a {trained_s:.0f} s probe, grown to at "
        f"most {', '.join(f'{a:.2f}' for a in grown1)} / "
        f"{', '.join(f'{a:.2f}' for a in grown5)} after {full_s:.0f} s of training; "
        f"{shape}, {drafting}, verified at this device's cost",
    )


def proxy_bound(method: str, proxy_best: float, scored: int) -> Bound:
    """A method scored on a proxy over its seed settings: the best seed with headroom for
    the search that would follow."""
    return Bound(
        method,
        proxy_best * SEARCH_HEADROOM,
        f"the best of {scored} seed settings scored {proxy_best:.3f}x on the proxy; the "
        f"search could add at most {SEARCH_HEADROOM - 1:.0%}",
    )


def skip_reason(bound: Bound, lead: Lead | None, margin: float = MARGIN) -> str | None:
    """Why a method whose bound cannot beat the leader is skipped (None: it may win)."""
    floor = 1.0 + margin
    if bound.speedup <= floor:
        return (
            f"its optimistic bound {bound.speedup:.3f}x cannot clear plain greedy decoding "
            f"({bound.evidence})"
        )
    if lead is None or lead.method == bound.method or bound.speedup >= lead.low:
        return None
    return (
        f"its optimistic bound {bound.speedup:.3f}x is below {lead.method}'s measured "
        f"{lead.speedup:.3f}x [{lead.low:.3f}, {lead.high:.3f}] on {lead.prompts} search "
        f"prompts ({bound.evidence})"
    )


# --- the phases --------------------------------------------------------------------------


def answers_seconds(facts: Facts, prompts: int) -> float:
    """Decoding ``prompts`` answers of ``ANSWER_TOKENS`` tokens, batched."""
    return prompts * ANSWER_TOKENS * facts.forward_s / BATCHED_DECODING_GAIN


def probe_seconds(facts: Facts, method: str, training_s: float) -> float:
    """A method's probe: a draft-free one decodes its proxy's best side by side (at most
    ``DRAFT_FREE_PROBE_SHARE`` of ``training_s``, the training and tuning time); a head
    method trains a slice of its training time (``training_s``); a proxy-scored one scores
    its seeds."""
    if method in facts.train:
        return max(PROBE_LEAST_S, PROBE_SHARE * training_s)
    if method not in facts.draft_free:
        return 20.0  # its seeds scored on the proxy, about
    drafts = DRAFT_FREE_PROBE_DRAFTS * DRAFT_FREE_COST
    decode = PROBE_PROMPTS * facts.heldback_tokens * facts.forward_s * (1 + drafts)
    return min(decode, DRAFT_FREE_PROBE_SHARE * training_s) + 20.0  # + its proxy search


def measuring_phases(facts: Facts, methods: int, chains: int, seconds: float) -> list[Phase]:
    """The selection and the held-back measurement of ``methods`` (``chains`` of them
    with an expansion), planned from the tokens they decode: at most ``MEASURE_SHARE`` of the
    whole run's budget (of ``seconds`` without one), never under their least. Both decode
    as many tokens as the verdict's prompts: a method's speedup depends on the length
    (the draft-free method measured 0.99x at 64 tokens on search prompts, 1.44x at 128
    held back)."""
    tokens_per_s = 1.0 / facts.forward_s
    cost = 1 + SPECULATIVE_COST * methods
    share = MEASURE_SHARE * (facts.budget_s or seconds)
    # as many prompts as the share holds, between the least an interval needs and the
    # planned (a slow or busy machine: 12 prompts of 3 decoders were 8:28 of a 20:00 run)
    per_held_back = facts.heldback_tokens * cost / tokens_per_s
    fit = int(share / per_held_back)
    held_back = min(facts.heldback_prompts, max(LEAST_INTERVAL_PROMPTS, min(HELDBACK_PLANNED, fit)))
    held_back_s = held_back * per_held_back
    phases = []
    if methods > 1 or chains:  # one method alone has nothing to choose between
        per_prompt = facts.heldback_tokens * (cost + SPECULATIVE_COST * chains) / tokens_per_s
        select = min(facts.select_prompts, max(2, int((share - held_back_s) / per_prompt)))
        phases.append(
            Phase(
                "selection (search prompts)",
                select * per_prompt,
                f"{select} prompts x {1 + methods + chains} decoders",
                reserved=True,
                count=select,
            )
        )
    phases.append(
        Phase(
            "held-back measurement",
            held_back_s,
            f"{held_back} prompts x {1 + methods} decoders (more when undecided), "
            f"{tokens_per_s:.0f} tokens/s greedy",
            reserved=True,
            count=held_back,
        )
    )
    if facts.engine_decoders:
        phases.append(engine_phase(facts, held_back, seconds))
    if facts.load_levels:
        phases.append(
            Phase(
                "under load (held back)",
                min(LOAD_SHARE * (facts.budget_s or seconds), load_seconds(facts)),
                f"up to {facts.load_levels} concurrency levels, as the time allows",
                reserved=True,
            )
        )
    return phases


def engine_phase(facts: Facts, prompts: int, seconds: float) -> Phase:
    """The held-back prompts decoded in a serving engine by each of its decoders (its own
    speed unknown until then: about this machine's forward), at most ``ENGINE_SHARE``."""
    decoding = prompts * facts.heldback_tokens * facts.forward_s * facts.engine_decoders
    planned = decoding + ENGINE_START_S * facts.engine_decoders
    return Phase(
        "in serving engine (held back)",
        min(ENGINE_SHARE * (facts.budget_s or seconds), planned),
        f"{prompts} prompts x {facts.engine_decoders} decoders in the engine itself",
        reserved=True,
    )


def load_level_runs(candidates: int, proven: bool) -> int:
    """Decodings of one round at a level under load: plain decoding and each candidate on
    the search rounds, then plain and two settings held back; a level the verdict proved
    (one request in flight): plain and the tuned setting held back."""
    return 2 if proven else candidates + 1 + 3


def load_seconds(facts: Facts) -> float:
    """About what measuring every level under load takes (the first one request in
    flight, proven), each run about 2 x LOAD_TOKENS forwards, a forward slower as the
    batch grows."""
    per_run = 2 * LOAD_TOKENS * facts.forward_s * SPECULATIVE_COST * LOAD_ROUNDS
    return sum(
        per_run * load_level_runs(LOAD_CANDIDATES, proven=i == 0) * (1 + 0.1 * 2**i)
        for i in range(facts.load_levels)
    )


def phases(facts: Facts, evidence: Evidence, seconds: float) -> list[Phase]:
    """The phases still to run, in order, with ``seconds`` left for them all: the
    answers; each contender's probe not yet run; the answers heads also learn from and
    the training of each head kind still in the race (its probe's slice taken from it);
    each contender's tuning (the time the skipped left goes to those that remain); the
    expansion's fit; the selection and the held-back measurement."""
    contenders = evidence.contenders(facts)
    chains = sum(m in facts.chain_methods for m in contenders)
    measuring = measuring_phases(facts, len(contenders), chains, seconds)
    rest = max(seconds - sum(p.seconds for p in measuring), 0.0)
    out: list[Phase] = []
    if "answers" not in evidence.done and facts.answer_prompts:
        answers = answers_seconds(facts, facts.answer_prompts)
        out.append(Phase("answers", answers, f"{facts.answer_prompts} search prompts, batched"))
        rest = max(rest - answers, 0.0)
    kinds = [
        k
        for k in dict.fromkeys(facts.train[m] for m in contenders if m in facts.train)
        if k not in evidence.trained
    ]
    tuned = [m for m in contenders if f"tune {m}" not in evidence.done]
    leader, first = _leader_first(facts, evidence, tuned, rest)
    rest -= first
    training = TRAINING_SHARE * rest if kinds else 0.0
    extra = 0.0
    if kinds and "extra answers" not in evidence.done and facts.extra_answer_prompts:
        extra = min(ANSWERS_SHARE * training, answers_seconds(facts, facts.extra_answer_prompts))
    per_kind = {k: (training - extra) / len(kinds) for k in kinds}
    probes, tuning = _probes(facts, evidence, contenders, per_kind, rest, rest - training)
    out += probes
    expansion = EXPANSION_SHARE * tuning if chains and tuned else 0.0
    others = [m for m in tuned if not first or m != leader]
    if first:  # before the training: training never starves it
        out.append(Phase(f"tune {leader}", first, "the leader, first"))
    if extra:
        out.append(Phase("extra answers", extra, "packaged calibration prompts, for heads"))
    out += [Phase(f"train {kind} heads", per_kind[kind]) for kind in kinds]
    out += [Phase(f"tune {m}", (tuning - expansion) / len(others)) for m in others]
    if expansion:
        out.append(Phase(f"fit {facts.expansion}", expansion, f"{chains} chain methods"))
    return out + measuring


def _leader_first(
    facts: Facts, evidence: Evidence, tuned: list[str], rest: float
) -> tuple[str | None, float]:
    """The leader and the seconds of its study, run before any training (the likeliest
    answer first); 0 when there is no leader to tune or nothing else to tune."""
    leader = evidence.lead.method if evidence.lead is not None else None
    if leader not in tuned or len(tuned) <= 1:
        return leader, 0.0
    wanted = facts.leader_tuning_s.get(leader or "", 0.0)
    return leader, min(LEADER_MAX_SHARE * rest, max(LEADER_TUNING_SHARE * rest, wanted))


def _probes(
    facts: Facts,
    evidence: Evidence,
    contenders: list[str],
    per_kind: dict[str, float],
    rest: float,
    tuning: float,
) -> tuple[list[Phase], float]:
    """The probes not yet run, each taken from its kind's training (``per_kind``, reduced
    in place) or from the ``tuning`` time; returns them and the tuning time left."""
    out = []
    for method in contenders:
        if f"probe {method}" in evidence.done or not probe_pays(facts, method, contenders):
            continue
        kind = facts.train.get(method)
        if kind is not None and kind not in per_kind:
            continue  # trained already: nothing left to probe
        probe = probe_seconds(facts, method, per_kind[kind] if kind else rest)
        out.append(Phase(f"probe {method}", probe, _probe_why(facts, method)))
        if kind is not None:
            per_kind[kind] = max(per_kind[kind] - probe, 0.0)
        else:
            tuning = max(tuning - probe, 0.0)
    return out, tuning


def probe_pays(facts: Facts, method: str, contenders: Sequence[str]) -> bool:
    """Whether ``method``'s probe can change the run. Where the user named the methods no
    bound skips one, so only a draft-free method's measurement, which may make it the
    leader tuned first among several, is worth its time (beside three CPU hogs the probe
    of a named n-gram alone took 1:21 of a 6:00 run and decided nothing)."""
    return not facts.named or (method in facts.draft_free and len(contenders) > 1)


def _probe_why(facts: Facts, method: str) -> str:
    if method in facts.train:
        return f"{facts.train[method]} heads trained for a slice: a bound on their accuracy"
    if method in facts.draft_free:
        return f"its proxy's best against greedy on {PROBE_PROMPTS} search prompts"
    return "its seed settings on the proxy: a bound"


def least_budget(facts: Facts) -> float:
    """The least time worth going on with, from here: the answers to ``LEAST_ANSWERS``
    search prompts (what a proxy replays) and the least held-back measurement an interval
    needs (``LEAST_INTERVAL_PROMPTS``) of one method against greedy (a draft-free one's
    cost where every method is draft-free). The probes and studies, and the trial
    workers' start-up, shrink to what is left; these do not."""
    draft_free = bool(facts.methods) and set(facts.methods) <= set(facts.draft_free)
    cost = DRAFT_FREE_COST if draft_free else SPECULATIVE_COST
    measure = LEAST_INTERVAL_PROMPTS * facts.heldback_tokens * facts.forward_s * (1 + cost)
    answers = answers_seconds(facts, min(facts.answer_prompts, LEAST_ANSWERS))
    return math.ceil((answers + measure) / 10.0) * 10.0


def cannot_train(
    facts: Facts, planned: dict[str, float], evidence: Evidence
) -> tuple[set[str], str] | None:
    """Head kinds still in the race that cannot be trained here, or usefully in the time
    ``planned`` for them (the one needing the most time first), with the reason; None
    when every kind can."""
    kinds = {k for m, k in facts.train.items() if m not in evidence.skipped}
    if not kinds:
        return None
    if facts.cpu and facts.params > CPU_TRAINABLE_PARAMS:
        why = (
            f"the model has {facts.params / 1e9:.1f}B parameters, too many to train heads on a CPU"
        )
        return kinds, why
    least = facts.min_training
    short = [k for k in kinds if planned.get(k, 0.0) < least.get(k, 0.0)]
    if not short:
        return None
    kind = max(short, key=lambda k: (least.get(k, 0.0), _prior_rank(k), k))
    return {kind}, (
        f"the budget leaves {clock(planned.get(kind, 0.0))} (m:s) to train {kind} heads, "
        f"under the {clock(least.get(kind, 0.0))} they need to be worth measuring; give "
        "more --budget, or"
    )


def untrainable(facts: Facts, evidence: Evidence, seconds: float) -> dict[str, str]:
    """Head kind -> why it is dropped: each kind ``cannot_train`` names, the plan made
    again without it (its time goes to the kinds left), until every kind left can train."""
    dropped: dict[str, str] = {}
    while found := cannot_train(facts, training_planned(facts, evidence, seconds), evidence):
        kinds, why = found
        dropped.update(dict.fromkeys(kinds, why))
        methods = {m: why for m, kind in facts.train.items() if kind in kinds}
        evidence = dataclasses.replace(evidence, skipped={**methods, **evidence.skipped})
    return dropped


def _prior_rank(kind: str) -> int:
    """Where ``kind`` stands in ``HEADS_PRIOR`` (one it does not name after them all)."""
    return HEADS_PRIOR.index(kind) if kind in HEADS_PRIOR else len(HEADS_PRIOR)


def training_planned(facts: Facts, evidence: Evidence, seconds: float) -> dict[str, float]:
    """Head kind -> the seconds the plan gives its training (probe included)."""
    planned: dict[str, float] = {}
    for phase in phases(facts, evidence, seconds):
        for method, kind in facts.train.items():
            if phase.name in (f"probe {method}", f"train {kind} heads"):
                planned[kind] = planned.get(kind, 0.0) + phase.seconds
    return planned
