"""The published way of searching a skip mask (Draft & Verify), for comparison only:
UCB Bayesian optimisation over 2L continuous variables rounded at 0.5, objective the
raw draft-and-verify tokens/s on 8 prompts x 32 tokens, with its default draft exit."""

from __future__ import annotations

import time
from collections.abc import Callable

from autotune.drafters.self_spec import DV_DEFAULT_POLICY, LayerSkipDrafter
from autotune.engine.decoding import decode_speculative
from autotune.engine.runner import Runner
from autotune.engine.skip import SkipMask

DV_PROMPTS = 8
DV_TOKENS = 32
DV_GP_NOISE = 1e-2  # the GP noise its search sets
DV_UCB_KAPPA = 2.576  # bayes_opt's default UCB exploration weight


def tokens_per_second(runner: Runner, skip: SkipMask, prompts: list[list[int]]) -> float:
    if skip.size == 0:
        return 0.0  # not a draft: nothing to speculate with
    drafter = LayerSkipDrafter(skip, DV_DEFAULT_POLICY)
    tokens, start = 0, time.perf_counter()
    for ids in prompts:
        tokens += len(decode_speculative(runner, drafter, ids, DV_TOKENS).tokens)
    return tokens / (time.perf_counter() - start)


def dv_search(
    runner: Runner,
    prompts: list[list[int]],
    trials: int,
    seed: int = 0,
    on_trial: Callable[[float], None] | None = None,
) -> tuple[SkipMask, list[float]]:
    """Returns the best mask found and the objective of every trial."""
    import skopt
    from skopt.learning import GaussianProcessRegressor
    from skopt.learning.gaussian_process.kernels import Matern, WhiteKernel

    layers = runner.num_layers
    prompts = prompts[:DV_PROMPTS]
    kernel = Matern(nu=2.5) + WhiteKernel(noise_level=DV_GP_NOISE, noise_level_bounds="fixed")
    optimizer = skopt.Optimizer(
        [skopt.space.Real(0.0, 1.0)] * (2 * layers),
        base_estimator=GaussianProcessRegressor(kernel=kernel, normalize_y=True),
        acq_func="LCB",
        acq_func_kwargs={"kappa": DV_UCB_KAPPA},
        n_initial_points=min(5, trials),
        random_state=seed,
    )
    best, best_value, values = SkipMask(), -1.0, []
    for _ in range(trials):
        point = optimizer.ask()
        skip = SkipMask.from_bits([int(v > 0.5) for v in point], layers)
        value = tokens_per_second(runner, skip, prompts)
        optimizer.tell(point, -value)
        values.append(value)
        if value > best_value:
            best, best_value = skip, value
        if on_trial:
            on_trial(value)
    return best, values
