"""Fitting CAPE for one chain method: its chain models (measured along calibration
decoding), this device's verify-latency curve, and the fit (``tuners.cape_fit``)."""

from __future__ import annotations

from autotune.methods.base import Method, TuneContext
from autotune.methods.cape.settings import CapeSettings
from autotune.methods.cape.space import CapeSpace
from autotune.progress import say
from autotune.tuners.cape_fit import fit_best


def fit(method: Method, settings, ctx: TuneContext) -> CapeSettings:
    """Bins and sizes for ``method``'s chain, chosen on the search split."""
    space: CapeSpace = ctx.space
    models = method.chain_models(settings, ctx)
    verify = ctx.workspace.verify_curve(space.max_verify_tokens)
    model, result, plain = fit_best(models, verify, space.fit_settings())
    say(
        f"cape on {method.name} ({model.label}): fitted tokens per step by confidence "
        f"{result.policy.describe()}; predicted {result.predicted.speedup:.3f}x (no "
        f"expansion {result.no_expansion.speedup:.3f}x)"
    )
    search = {
        "predicted_no_expansion": round(result.no_expansion.speedup, 4),
        "predicted": round(result.predicted.speedup, 4),
        "predicted_tokens_per_step": round(result.predicted.tokens_per_step, 3),
        "predicted_verified_per_step": round(result.predicted.verified_per_step, 2),
        "replays": result.replays,
        **model.info,
        "seconds": round(ctx.budget.elapsed(), 1),
    }
    if len(plain) > 1:
        search["predicted_no_expansion_by_chain"] = {k: round(v, 4) for k, v in plain.items()}
    return CapeSettings.of(
        result.policy,
        chain_depth=model.chain_depth,
        predicted_speedup=round(result.predicted.speedup, 4),
        search=search,
    )
