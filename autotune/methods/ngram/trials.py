"""The n-gram study's trials (run by Ray Tune workers): one flat parameter space over
both kinds (``kind`` picks which parameters count), and real decoding."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from autotune.drafters.ngram import LookupConfig, NgramDrafter
from autotune.drafters.suffix import SuffixConfig
from autotune.measure.timing import EncodedPrompt
from autotune.methods.ngram.replay import Replayer
from autotune.methods.ngram.settings import Config, block_of
from autotune.methods.ngram.space import NgramSpace
from autotune.models.ref import TargetRef

SHARED = ("min_match", "max_match", "draft_tokens", "max_tree_tokens")
LOOKUP_ONLY = ("candidates", "branch_tokens", "prefer")
SUFFIX_ONLY = ("tokens_per_match", "min_probability")


def distributions(space: NgramSpace) -> dict:
    """Every parameter as a categorical over its grids and start values (both kinds' for
    the shared ones), so that every seed lies inside it."""
    from optuna.distributions import CategoricalDistribution

    def grid(name: str) -> list:
        values: set = set()
        for kind in (space.ngram, space.suffix):
            values.update(getattr(kind, name, []))
            if hasattr(kind.start, name):
                values.add(getattr(kind.start, name))
        return sorted(values, key=str) if name == "prefer" else sorted(values)

    names = SHARED + LOOKUP_ONLY + SUFFIX_ONLY
    return {
        "kind": CategoricalDistribution(["ngram", "suffix"]),
        **{name: CategoricalDistribution(grid(name)) for name in names},
    }


def config_from_params(params: dict) -> Config:
    """The drafter settings a trial's parameters name (min_match clipped to max_match)."""
    shared = {name: params[name] for name in SHARED}
    shared["min_match"] = min(shared["min_match"], shared["max_match"])
    if params["kind"] == "ngram":
        return LookupConfig(**shared, **{name: params[name] for name in LOOKUP_ONLY})
    return SuffixConfig(**shared, **{name: params[name] for name in SUFFIX_ONLY})


def params_from_config(config: Config, space: NgramSpace) -> dict:
    """A trial's parameters for ``config``; the other kind's take their start values."""
    values = {
        **space.ngram.start.model_dump(),
        **space.suffix.start.model_dump(),
        **{k: v for k, v in block_of(config).model_dump().items() if k != "kind"},
    }
    kind = "ngram" if isinstance(config, LookupConfig) else "suffix"
    return {"kind": kind, **{name: values[name] for name in SHARED + LOOKUP_ONLY + SUFFIX_ONLY}}


@dataclass
class NgramObjective:
    """A trial, cheapest fidelity first (``methods.studies.Progressive``). With a
    ``proxy``, its first result is the speedup the replay predicts (milliseconds), and a
    setting predicted below ``proxy_floor`` stops there, pruned before it decodes
    anything. Then the measured speedup over the prompts so far, after each prompt, so
    that ASHA may stop it after ``grace`` results. Plain greedy timings are this
    worker's, shared by its trials (``measure.shared_greedy``). Times wall clock, so
    trials must not share the machine's cores."""

    target: TargetRef
    prompts: list[EncodedPrompt]
    max_new_tokens: int
    grace: int = 3
    proxy: Replayer | None = None
    proxy_floor: float = 0.0

    @property
    def fidelities(self) -> int:
        return len(self.prompts) + (self.proxy is not None)

    def steps(self, config: dict) -> Iterator[dict]:
        from autotune.measure.shared_greedy import for_process
        from autotune.measure.timing import Measurement
        from autotune.studies.tune import STOPPED

        setting = config_from_params(config)
        draft = block_of(setting).model_dump()
        if self.proxy is not None:
            predicted = self.proxy.speedup(setting, self.proxy.indices())
            result = {"objective": predicted, "prompts": 0, "proxy": predicted, "draft": draft}
            if predicted < self.proxy_floor:
                yield {**result, STOPPED: f"the proxy predicts {predicted:.3f}x"}
                return
            yield result
        runner, drafter = self.target.runner(), NgramDrafter(setting)
        greedy = for_process(self.target, self.max_new_tokens)
        greedy.warm_up(runner, drafter, self.prompts[0])
        measured = Measurement()
        for prompt in self.prompts:
            # raises LossyDecoding (the trial fails, with its reason) on a differing output
            measured.prompts.append(greedy.method_row(runner, prompt, drafter))
            if len(measured.prompts) < len(self.prompts):
                yield {
                    "objective": measured.speedup,
                    "prompts": len(measured.prompts),
                    "draft": draft,
                }
        yield {"objective": measured.speedup, "draft": draft, **measured.summary()}

    def __call__(self, config: dict) -> dict:
        *_, final = self.steps(config)
        return final
