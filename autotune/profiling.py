"""`autotune profile`: tune each requested method, write the profile."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from autotune.engine.sampling import GREEDY
from autotune.errors import AutotuneError
from autotune.profile.io import check_writable, write_profile
from autotune.profile.schema import (Adaptive, DraftSettings, EagleMethod, HardwareInfo,
                                     MedusaAcceptance, MedusaMethod, Measured, Methods,
                                     ModelInfo, Profile, SelfSpecMethod, SkipLayers, Workload,
                                     recommend)
from autotune.models.ref import TargetRef
from autotune.workspace import Workspace

KNOWN_METHODS = ("self-spec", "medusa", "eagle", "cape")
CAPE_DRAFTERS = ("self-spec", "eagle")  # the chain drafters CAPE expands


@dataclass
class ProfileOptions:
    model: str
    model_path: str | None = None
    methods: tuple[str, ...] = ("self-spec",)
    prompts: str | None = None
    out: Path | None = None
    storage: str | None = None
    trials: int | None = None
    time_budget_s: float | None = None
    search_space: str | None = None
    medusa_heads: str | None = None
    medusa_search_space: str | None = None
    eagle_head: str | None = None
    eagle_search_space: str | None = None
    cape_search_space: str | None = None
    ray_address: str | None = None
    workers: int = 1                  # trials at once
    cpus_per_trial: float | None = None  # None: the rule of studies.tune.trial_resources
    gpus_per_trial: float = 0.0
    dtype: str = "float32"
    device: str = "cpu"


def parse_methods(text: str) -> tuple[str, ...]:
    methods = tuple(m.strip() for m in text.split(",") if m.strip())
    unknown = [m for m in methods if m not in KNOWN_METHODS]
    if unknown or not methods:
        raise AutotuneError(f"unknown method {', '.join(unknown) or '(none)'}: "
                            f"choose from {', '.join(KNOWN_METHODS)}")
    if "cape" in methods and not set(methods) & set(CAPE_DRAFTERS):
        raise AutotuneError("cape expands a chain drafter: add self-spec or eagle, e.g. "
                            "--methods self-spec,cape")
    return methods


def default_out(model_name: str) -> Path:
    return Path("profiles") / f"{model_name}.yaml"


def model_info(ws: Workspace) -> ModelInfo:
    cfg = ws.runner.config
    return ModelInfo(name=ws.target.name, path=str(ws.target.path),
                     fingerprint=ws.target.fingerprint, architecture=ws.target.architecture,
                     num_layers=ws.runner.num_layers, hidden_size=cfg.hidden_size,
                     vocab_size=cfg.vocab_size, dtype=ws.target.dtype)


def measured_block(measurement) -> Measured:
    return Measured(**measurement.summary())


def self_spec_block(result) -> SelfSpecMethod:
    rule = result.policy.adaptive
    return SelfSpecMethod(
        skip=SkipLayers(**result.skip.as_dict()),
        draft=DraftSettings(max_tokens=result.policy.max_tokens,
                            exit_threshold=round(result.policy.exit_threshold, 4),
                            adaptive=None if rule is None else Adaptive(**rule.__dict__)),
        measured=measured_block(result.measured), study=result.study, search=result.search)


def medusa_block(result, heads_dir: str) -> MedusaMethod:
    return MedusaMethod(heads=str(Path(heads_dir).resolve()), num_heads=result.num_heads,
                        tree=[list(p) for p in result.tree],
                        acceptance=MedusaAcceptance(**result.acceptance),
                        measured=measured_block(result.measured), study=result.study,
                        search=result.search)


def eagle_block(result, head_dir: str) -> EagleMethod:
    from autotune.tuners.eagle import tree_settings

    return EagleMethod(head=str(Path(head_dir).resolve()), tree=tree_settings(result.tree),
                       draft_vocab=result.vocab, measured=measured_block(result.measured),
                       alternatives=result.alternatives, study=result.studies,
                       search=result.search)


def _check_eagle_head(options: ProfileOptions) -> None:
    """Before any long work: eagle needs a head folder that exists."""
    if "eagle" not in options.methods:
        return
    if not options.eagle_head:
        raise AutotuneError("--methods eagle needs --eagle-head DIR (an EAGLE head folder; "
                            "train one with `autotune heads train --kind eagle`)")
    from autotune.heads.eagle import CONFIG, WEIGHTS

    folder = Path(options.eagle_head).expanduser()
    if not (folder / CONFIG).is_file() or not any((folder / w).is_file() for w in WEIGHTS):
        raise AutotuneError(f"--eagle-head {folder}: needs {CONFIG} and "
                            f"{' or '.join(WEIGHTS)}; train a head with "
                            "`autotune heads train --kind eagle`")


def _check_medusa_heads(options: ProfileOptions) -> None:
    """Before any long work: medusa needs a head folder that exists."""
    if "medusa" not in options.methods:
        return
    if not options.medusa_heads:
        raise AutotuneError("--methods medusa needs --medusa-heads DIR (a Medusa head folder; "
                            "train one with `autotune heads train --kind medusa`)")
    folder = Path(options.medusa_heads).expanduser()
    if not folder.is_dir() or not any(folder.glob("medusa_lm_head.*")):
        raise AutotuneError(f"--medusa-heads {folder}: no medusa_lm_head.safetensors or .pt "
                            "there; train heads with `autotune heads train --kind medusa`")


def run_profile(options: ProfileOptions) -> tuple[Profile, Path]:
    from autotune.studies.tune import Workers
    from autotune.tuners.self_spec import SearchLimits, tune_self_spec
    from autotune.tuners.cape import cape_block, fit_eagle_cape, fit_self_spec_cape
    from autotune.tuners.space import (load_cape_space, load_eagle_space, load_medusa_space,
                                       load_self_spec_space)

    space = load_self_spec_space(options.search_space)
    medusa_space = load_medusa_space(options.medusa_search_space) \
        if "medusa" in options.methods else None
    eagle_space = load_eagle_space(options.eagle_search_space) \
        if "eagle" in options.methods else None
    cape_space = load_cape_space(options.cape_search_space) \
        if "cape" in options.methods else None
    _check_medusa_heads(options)
    _check_eagle_head(options)
    ref = TargetRef.for_user(options.model, options.model_path, options.dtype, options.device)
    if options.out is not None:
        check_writable(options.out)
    ws = Workspace.open(ref, options.prompts, options.storage)
    out = options.out or default_out(ws.target.name)
    check_writable(out)
    limits = SearchLimits(options.trials, options.time_budget_s,
                          Workers(options.workers, options.cpus_per_trial,
                                  options.gpus_per_trial, options.ray_address))
    methods = Methods()
    if "self-spec" in options.methods:
        result = tune_self_spec(ws, space, limits)
        methods.self_spec = self_spec_block(result)
        if cape_space is not None:
            methods.self_spec.cape = cape_block(
                fit_self_spec_cape(ws, result, space.measure, cape_space))
    if "medusa" in options.methods:
        from autotune.tuners.medusa import tune_medusa

        heads_dir = str(Path(options.medusa_heads).expanduser().resolve())
        methods.medusa = medusa_block(tune_medusa(ws, medusa_space, heads_dir, limits), heads_dir)
    if "eagle" in options.methods:
        from autotune.tuners.eagle import tune_eagle

        head_dir = str(Path(options.eagle_head).expanduser().resolve())
        result = tune_eagle(ws, eagle_space, head_dir, limits)
        methods.eagle = eagle_block(result, head_dir)
        if cape_space is not None:
            methods.eagle.cape = cape_block(
                fit_eagle_cape(ws, result, head_dir, eagle_space, cape_space))
    profile = Profile(
        model=model_info(ws), hardware=HardwareInfo(**ws.hardware),
        workload=Workload(prompts=str(ws.prompts_path.resolve()), num_prompts=len(ws.prompts),
                          max_new_tokens=space.measure.confirm_tokens,
                          temperature=GREEDY.temperature),
        recommended=recommend(methods), methods=methods)
    write_profile(profile, out)
    return profile, out


def verdict(profile: Profile) -> list[str]:
    """One line per method: what was measured and what it means."""
    lines = []
    for name, method in profile.methods:
        if method is None:
            continue
        m = method.measured
        word = "faster" if m.speedup > 1.0 else "slower"
        lines.append(f"{name}: {m.speedup:.3f}x plain greedy ({m.tokens_per_s:.1f} vs "
                     f"{m.baseline_tokens_per_s:.1f} tokens/s, {m.tokens_per_step:.2f} tokens/step, "
                     f"acceptance {m.acceptance_rate:.2f}, lossless {m.lossless}) on {m.prompts} "
                     f"held-back prompts: {word} than plain greedy on this device")
        cape = getattr(method, "cape", None)
        if cape is not None and cape.measured is not None:
            c = cape.measured
            from autotune.tuners.cape import policy_from_block
            sizes = policy_from_block(cape).describe()
            lines.append(f"{name} + cape (tokens per step by draft confidence {sizes}): "
                         f"{c.speedup:.3f}x plain greedy ({c.tokens_per_step:.2f} tokens/step, "
                         f"lossless {c.lossless}) on {c.prompts} held-back prompts")
    if profile.recommended == "none":
        lines.append("recommended: none. No method measured faster than plain greedy "
                     "decoding here; serve without speculation on this device.")
    else:
        lines.append(f"recommended: {profile.recommended}")
    return lines
