"""scikit-optimize's Gaussian-process optimiser as an Optuna sampler.

optuna-integration 5 no longer ships one; this adapter covers the integer and float
parameters our search spaces use. The optimiser is rebuilt from the study's finished
trials at every ask (the study, not the sampler, holds the state, so several processes
can share it); its random state moves with the trial number, or every rebuild would
draw the same random point again.
"""

from __future__ import annotations

import optuna
from optuna.distributions import FloatDistribution, IntDistribution
from optuna.samplers import BaseSampler, RandomSampler


class SkoptSampler(BaseSampler):
    def __init__(
        self,
        acq_func: str = "gp_hedge",
        n_initial_points: int = 10,
        noise: float | str = "gaussian",
        seed: int | None = None,
    ):
        self._acq_func = acq_func
        self._n_initial = n_initial_points
        self._noise = noise
        self._seed = seed
        self._fallback = RandomSampler(seed=seed)

    def infer_relative_search_space(self, study, trial):
        space = optuna.search_space.intersection_search_space(study.get_trials())
        return {
            k: d
            for k, d in space.items()
            if isinstance(d, (IntDistribution, FloatDistribution)) and not d.log
        }

    def sample_relative(self, study, trial, search_space):
        import skopt

        if not search_space:
            return {}
        names = sorted(search_space)
        dims = [
            skopt.space.Integer(d.low, d.high)
            if isinstance(d, IntDistribution)
            else skopt.space.Real(d.low, d.high)
            for d in (search_space[n] for n in names)
        ]
        random_state = None if self._seed is None else self._seed + trial.number
        optimizer = skopt.Optimizer(
            dims,
            base_estimator="GP",
            acq_func=self._acq_func,
            n_initial_points=self._n_initial,
            random_state=random_state,
        )
        done = [
            t
            for t in study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
            if all(n in t.params for n in names)
        ]
        if done:
            sign = -1.0 if study.direction == optuna.study.StudyDirection.MAXIMIZE else 1.0
            optimizer.tell(
                [[t.params[n] for n in names] for t in done], [sign * t.value for t in done]
            )
        point = optimizer.ask()
        return {
            n: (int(v) if isinstance(search_space[n], IntDistribution) else float(v))
            for n, v in zip(names, point)
        }

    def sample_independent(self, study, trial, param_name, param_distribution):
        return self._fallback.sample_independent(study, trial, param_name, param_distribution)
