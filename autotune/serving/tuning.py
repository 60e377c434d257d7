"""The n-gram setting llama.cpp serves, tuned in llama.cpp itself (``autotune verify
PROFILE --engine llamacpp --tune``).

Autotune's engine prices a verify pass of k tokens by its own float32 kernels; llama.cpp
prices it by its own (quantized weights, its own batching and server loop), so the
``ngram-simple`` setting best in one need not be best in the other. Here ``llama-server``
decodes search prompts with each setting of ngram-simple's two options beside its own
greedy decoding (one server each, the order alternating prompt by prompt), as an Optuna
study in the study database: a grid sampler over the options and a successive-halving
pruner, so that a setting behind the others after a few prompts stops there. Every
output is checked against the greedy one. The fastest setting, with its figures, becomes
the profile's llama.cpp setting; when even it is not clearly faster than greedy, the
answer for llama.cpp is no speculation, and the export says so.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from autotune.budget import Budget
from autotune.errors import AutotuneError
from autotune.measure.timing import EncodedPrompt, Measurement, PromptMeasurement
from autotune.serving import llamacpp, paired

# ngram-simple's options: the match length n (exactly n tokens) and the draft length m,
# as "n,m". It drafts only where at least n tokens follow the match, so m < n never drafts.
GRID = [f"{n},{m}" for n in (1, 2, 3, 4) for m in (2, 3, 4, 6, 8, 12) if m >= n]
# Prompts every setting decodes before the pruner may stop it; at most PROMPTS in all.
GRACE = 2
PROMPTS = 8


@dataclass(frozen=True)
class InEngine:
    """The fastest setting found in the engine, and how it measured there."""

    size_n: int
    size_m: int
    measurement: Measurement  # against the engine's greedy decoding, search prompts
    trials: int  # settings tried (whole and pruned)
    release: str

    @property
    def pays(self) -> bool:
        """Clearly faster than the engine's greedy decoding (the interval above 1)."""
        return self.measurement.interval().above(1.0)


def sizes(setting: str) -> tuple[int, int]:
    """``"n,m"`` as its two numbers."""
    size_n, size_m = setting.split(",")
    return int(size_n), int(size_m)


def ngram_simple(size_n: int, size_m: int) -> list[str]:
    return [
        *("--spec-type", "ngram-simple"),
        *("--spec-ngram-simple-size-n", str(size_n)),
        *("--spec-ngram-simple-size-m", str(size_m)),
    ]


def tune_ngram(
    gguf: Path,
    prompts: Sequence[EncodedPrompt],
    max_new_tokens: int,
    storage,  # an Optuna storage (the study database)
    budget: Budget,
    on_trial: Callable[[], None] | None = None,
) -> InEngine:
    """The fastest ngram-simple setting on ``prompts`` (search prompts), in llama-server."""
    import optuna

    prompts = list(prompts[:PROMPTS])
    if len(prompts) < GRACE:
        raise AutotuneError("too few search prompts to tune in llama.cpp: pass more prompts")
    # a study per prompts and grid: its trials are comparable, and resume after a stop
    digest = hashlib.sha256(repr(([p.ids for p in prompts], GRID)).encode()).hexdigest()[:8]
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        study_name=f"llamacpp-ngram/{gguf.stem}/{llamacpp.release()}/{max_new_tokens}/{digest}",
        storage=storage,
        direction="maximize",
        sampler=optuna.samplers.GridSampler({"setting": GRID}, seed=0),
        pruner=optuna.pruners.SuccessiveHalvingPruner(min_resource=GRACE, reduction_factor=3),
        load_if_exists=True,
    )
    with llamacpp.Server(gguf) as greedy:
        greedy.decode(prompts[0].ids, 8)  # warm-up
        objective = _Objective(gguf, greedy, prompts, max_new_tokens, budget)
        left = budget.left()
        study.optimize(
            objective,
            n_trials=len(GRID),
            timeout=left,
            callbacks=[lambda *_: on_trial()] if on_trial is not None else None,
        )
    done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    if not done:
        raise AutotuneError(
            "no llama.cpp setting decoded every search prompt in the time given: give more --budget"
        )
    best = max(done, key=lambda t: t.value or 0.0)
    rows = [PromptMeasurement(**row) for row in best.user_attrs["rows"]]
    size_n, size_m = sizes(best.params["setting"])
    return InEngine(
        size_n,
        size_m,
        Measurement(rows),
        len(study.trials),
        llamacpp.release(),
    )


@dataclass
class _Objective:
    """One setting: its own server, each prompt decoded beside the greedy server's, the
    speedup so far reported after each prompt for the pruner."""

    gguf: Path
    greedy: llamacpp.Server
    prompts: list[EncodedPrompt]
    max_new_tokens: int
    budget: Budget

    def __call__(self, trial) -> float:
        import optuna

        flags = ngram_simple(*sizes(trial.suggest_categorical("setting", GRID)))
        rows: list[PromptMeasurement] = []
        with llamacpp.Server(self.gguf, flags) as server:
            server.decode(self.prompts[0].ids, 8)  # warm-up
            for index, prompt in enumerate(self.prompts):
                order = (self.greedy, server) if index % 2 == 0 else (server, self.greedy)
                decoded = {id(s): s.decode(prompt.ids, self.max_new_tokens) for s in order}
                plain, done = decoded[id(self.greedy)], decoded[id(server)]
                if done.tokens != plain.tokens:
                    raise AutotuneError(
                        f"llama-server's output with {' '.join(flags)} differed from its "
                        "greedy output: please report this with the model and prompt"
                    )
                rows.append(paired(prompt, plain, done))
                speedup = Measurement(rows).speedup
                trial.report(speedup, index + 1)
                trial.set_user_attr("rows", [asdict(r) for r in rows])
                if trial.should_prune():
                    raise optuna.TrialPruned()
                if self.budget.spent() and index + 1 >= GRACE:
                    raise optuna.TrialPruned()  # cut short: not comparable with whole ones
        return speedup
