"""What a speculative method is to the rest of autotune.

A ``Method`` drafts (it has a block in the profile); an ``Expansion`` widens another
method's chain drafts (CAPE). Both register once in ``autotune.methods.registry``. The
pipeline (``autotune.profiling``) does what is common to all: it gives each method a
search space, a budget and the search split, asks it for its setting (``tune``), then
measures every setting once on the held-back split through ``drafter``.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel

from autotune.errors import AutotuneError
from autotune.export.base import Exporter

if TYPE_CHECKING:
    from autotune.budget import Budget
    from autotune.engine.proposal import ChainDrafter, Drafter
    from autotune.engine.runner import Runner
    from autotune.measure.timing import Measurement, Variant
    from autotune.models.ref import TargetRef
    from autotune.plan import Bound
    from autotune.profile.blocks import MethodSettings
    from autotune.studies.workers import Workers
    from autotune.workspace import Workspace

DrafterFactory = Callable[[], "Drafter"]
ChainFactory = Callable[[], "ChainDrafter"]


@dataclass
class DraftEnv:
    """What building a drafter from a method's settings needs."""

    ref: TargetRef
    runner: Runner
    base_dir: Path | None = None  # relative paths in the settings (heads) start here

    def resolve(self, path: str) -> Path:
        """A folder named in settings: absolute, or relative to ``base_dir``."""
        folder = Path(path).expanduser()
        if not folder.is_absolute() and self.base_dir is not None:
            folder = self.base_dir / folder
        return folder.resolve()


@dataclass
class TuneContext:
    """What a method tunes with. Every choice is made on ``workspace``'s search split."""

    workspace: Workspace
    space: Any  # the method's search space (its ``space_model``)
    budget: Budget  # this method's share of the run's time
    workers: Workers  # where study trials run
    heads: Path | None = None  # the head folder the method drafts with, if it needs one
    trials: int | None = None  # the user's cap on a method's main study (--trials)
    base_space: Any = None  # fitting an expansion: the expanded method's own space
    notes: list[str] = field(default_factory=list)  # what was cut short, one line each
    max_new_tokens: int = 128  # the verdict's decoding length (``--max-new-tokens``)
    # the serving engines the user deploys to (``--engine``): the search keeps to what they
    # can express; None: every engine's own setting is tuned beside the method's
    engines: tuple[str, ...] | None = None

    def note(self, line: str) -> None:
        from autotune.progress import say

        say(f"[yellow]{line}[/yellow]")
        self.notes.append(line)


@dataclass(frozen=True)
class Probe:
    """What a method's probe found before its expensive phases: an optimistic bound on
    the speedup it could reach, and, where the probe decoded against greedy, that
    measurement (a draft-free method's first figures: the run's first leader)."""

    bound: Bound
    measured: Measurement | None = None


class Entry(ABC):
    """A registered method or expansion."""

    name: ClassVar[str]  # the one spelling: CLI, profile, studies, exports
    title: ClassVar[str]  # for people
    kind: ClassVar[Literal["method", "expansion"]]
    summary: ClassVar[str] = ""
    space_model: ClassVar[type[BaseModel] | None] = None
    # What its tuning does with the time the plan gives it: each step's share of what is
    # left of that time when the step starts (``registry.time_share``); the plan
    # (``autotune.plan``) sizes the phases, each method sizes its own steps within one.
    time_shares: ClassVar[Mapping[str, float]] = {}

    def space(self, path: str | Path | None = None) -> Any:
        """The search space: the packaged ``space.yaml`` of the method's package, with the
        user's file (any subset of its keys) laid over it."""
        if self.space_model is None:
            return None
        return load_space(self, path)


class Method(Entry):
    kind: ClassVar[Literal["method", "expansion"]] = "method"
    settings_model: ClassVar[type[MethodSettings]]
    # the head kind it drafts with ("medusa", "eagle"): its folder must be given or found
    heads: ClassVar[str | None] = None
    # its drafter can run as a chain that reports ranked tokens: CAPE can widen it
    chain: ClassVar[bool] = False
    # it needs no trained weights and no calibration of its own: it runs first, and its
    # probe gives the run its first measured leader
    draft_free: ClassVar[bool] = False
    # engine name -> its exporter; engine name -> why it cannot serve this method
    exporters: ClassVar[Mapping[str, Exporter]] = {}
    cannot_export: ClassVar[Mapping[str, str]] = {}

    def for_engine(self, settings: Any, engine: str) -> Any:
        """The settings ``engine`` serves: the profile's variant for it where it holds
        one (``MethodSettings.engines``), else ``settings`` themselves."""
        return settings

    # It gathers cheap evidence before its training or studies (``probe``).
    probes: ClassVar[bool] = False

    def probe(self, ctx: TuneContext) -> Probe | None:
        """The cheap evidence gathered before this method's training or studies (None:
        it has none; it is tuned whatever the others measured): by default its tuning
        module's ``probe(ctx)`` where it ``probes``."""
        return self.tuning().probe(ctx) if self.probes else None

    def tuning_seconds(self, space: Any, forward_s: float, trials: int) -> float | None:
        """About how long its tuning takes to finish ``trials`` whole measured trials of
        its main study (and what follows it), at ``forward_s`` a greedy forward: what the
        plan gives it when it leads (None: no estimate; it gets the plan's share)."""
        return None

    def check_heads(self, folder: Path) -> None:
        """Fail at once (AutotuneError) if ``folder`` cannot be this method's heads."""

    def tune(self, ctx: TuneContext) -> MethodSettings:
        """Choose the setting on the search split; return the profile block (its
        ``measured`` figures are the pipeline's to fill): by default its tuning module's
        ``tune(ctx)``."""
        return self.tuning().tune(ctx)

    def tuning(self) -> Any:
        """The method package's ``tune`` module, imported when first needed (it loads the
        search libraries, which listing or exporting methods does not need)."""
        return importlib.import_module(f"{type(self).__module__}.tune")

    @abstractmethod
    def drafter(self, settings: Any, env: DraftEnv) -> DrafterFactory:
        """A factory of drafters with these settings (one per measurement)."""

    def deployed_drafter(self, settings: Any, env: DraftEnv) -> DrafterFactory:
        """The drafter the settings describe: with CAPE's expansion when they hold an
        enabled ``cape`` block."""
        cape = getattr(settings, "cape", None)
        if cape is None or not cape.enabled:
            return self.drafter(settings, env)
        from autotune.drafters.cape import CapeDrafter

        policy = cape.policy()
        base = self.chain_drafter(settings, env, max(policy.expansion), cape.chain_depth)
        return lambda: CapeDrafter(base(), policy)

    def variant(self, settings: Any, env: DraftEnv) -> Variant:
        """What measuring the settings decodes with: the deployed drafter and, for settings
        that differ by workload category, one per category (override to give those)."""
        from autotune.measure.timing import Variant

        return Variant(self.deployed_drafter(settings, env))

    def chain_drafter(
        self, settings: Any, env: DraftEnv, ranked_width: int, depth: int | None = None
    ) -> ChainFactory:
        """A chain drafter that reports ``ranked_width`` ranked tokens per step (CAPE's
        base); ``depth``: the chain's length when the method drafts trees."""
        raise NotImplementedError(f"{self.name} drafts no chain")

    def chain_models(self, settings: Any, ctx: TuneContext) -> list[Any]:
        """How this method's chain would decode the calibration continuations
        (``tuners.cape_fit.ChainModel``, one per chain configuration worth fitting)."""
        raise NotImplementedError(f"{self.name} drafts no chain")

    @abstractmethod
    def examples(self, model: Any, folder: Path) -> dict[str, Any]:
        """Small valid settings for ``model`` (a LLaMA-family ``*ForCausalLM``), by name,
        with any heads they need written under ``folder`` (random weights): what the
        drafter contract suite (``tests/test_drafter_contract.py``) runs every method on."""

    def problems(self, settings: Any, model: Any) -> list[str]:
        """What is wrong with these settings for ``model`` (the profile's model block)
        beyond their shape: indices outside the model, trees deeper than the heads."""
        return []

    def draft_size(self, settings: Any) -> int | None:
        """The most tokens one draft of these settings holds (None: not known); by
        default the settings' own ``draft_size()`` where they have one."""
        size = getattr(settings, "draft_size", None)
        return size() if callable(size) else None

    def capped(self, settings: Any, tokens: int) -> Any:
        """The settings with at most ``tokens`` draft tokens (a shorter chain, a smaller
        tree): what a larger batch may want, as verifying a draft costs more when a batch
        already fills the products (``measure.load``). None where the method cannot say;
        by default the settings' own ``capped(tokens)`` where they have one."""
        capped = getattr(settings, "capped", None)
        return capped(tokens) if callable(capped) else None

    def load_settings(self, settings: Any) -> dict[str, tuple[int | None, Any]]:
        """The candidates of each concurrency level, by label, with their draft-token cap:
        the settings themselves (no cap), then capped to half, a quarter, 2 and 1 token
        where that is fewer than they draft and the method can cap them."""
        from autotune.measure.load import TUNED, label_of

        out: dict[str, tuple[int | None, Any]] = {TUNED: (None, settings)}
        size = self.draft_size(settings) or 0
        for cap in sorted({size // 2, size // 4, 2, 1}, reverse=True):
            smaller = self.capped(settings, cap) if 0 < cap < size else None
            if smaller is not None:
                out[label_of(cap)] = (cap, smaller)
        return out


class Expansion(Entry):
    """Widens the drafts of the chain methods (``Method.chain``). Its fitted block sits in
    the chain method's settings (under ``settings_field``), enabled or not: the selection
    races the method with and without it."""

    kind: ClassVar[Literal["method", "expansion"]] = "expansion"
    settings_field: ClassVar[str]  # the chain method's settings field holding its block
    label: ClassVar[str]  # its fitting phase is called "fit <label>"
    # of the fitting phase's time left when each chain method's fit starts, its share
    fit_share: ClassVar[float]

    def block(self, settings: Any) -> Any | None:
        """Its block in a method's settings (None: not fitted there)."""
        return getattr(settings, self.settings_field, None)

    def variant_name(self, method: str) -> str:
        """What the method's candidate with this expansion is called in a race."""
        return f"{method}+{self.name}"

    def switched(self, settings: Any, enabled: bool, **search: Any) -> Any:
        """The settings with the block enabled or not (``search``: figures to record)."""
        block = self.block(settings)
        assert block is not None, f"{self.name} is not fitted on these settings"
        update: dict[str, Any] = {"enabled": enabled}
        if search:
            update["search"] = {**block.search, **search}
        return settings.model_copy(update={self.settings_field: block.model_copy(update=update)})

    @abstractmethod
    def fitted(self, method: Method, settings: Any, ctx: TuneContext) -> Any:
        """The method's settings with this expansion fitted on the search split."""

    @abstractmethod
    def describe(self, block: Any) -> str:
        """The fitted block, for people."""


def load_space(entry: Entry, path: str | Path | None = None) -> Any:
    import yaml
    from pydantic import ValidationError

    assert entry.space_model is not None
    packaged = resources.files(type(entry).__module__).joinpath("space.yaml")
    data = yaml.safe_load(packaged.read_text()) or {}
    if path is not None:
        path = Path(path).expanduser()
        if not path.is_file():
            raise AutotuneError(
                f"search space {path} not found: pass an existing YAML file "
                f"(`autotune search-space {entry.name}` prints the default)"
            )
        try:
            overlay = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            first = str(exc).replace("\n", " ")[:200]
            raise AutotuneError(f"search space {path} is not valid YAML: {first}") from None
        if not isinstance(overlay, dict):
            raise AutotuneError(f"search space {path} must be a mapping of settings")
        data = _merged(data, overlay)
    try:
        return entry.space_model.model_validate(data)
    except ValidationError as exc:
        first = str(exc).replace("\n", " ")[:300]
        where = path or f"the packaged search space of {entry.name}"
        raise AutotuneError(f"search space {where} is invalid: {first}") from None


def packaged_space_text(entry: Entry) -> str:
    return resources.files(type(entry).__module__).joinpath("space.yaml").read_text()


def _merged(base: dict, overlay: dict) -> dict:
    """``overlay`` laid over ``base``: mappings merge key by key, anything else replaces."""
    out = dict(base)
    for key, value in overlay.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merged(out[key], value)
        else:
            out[key] = value
    return out
