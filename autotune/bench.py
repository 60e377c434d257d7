"""`autotune bench`: measure a profile's methods again, on prompts of the user's choice."""

from __future__ import annotations

from pathlib import Path

from autotune.errors import AutotuneError, ModelNotFoundError
from autotune.measure.timing import categories_in_turn, measure_variants
from autotune.methods import registry
from autotune.methods.base import DraftEnv
from autotune.models.ref import TargetRef
from autotune.profile.blocks import AUTOTUNE_ENGINE, ModelInfo, by_rule
from autotune.profile.io import read_profile
from autotune.profile.schema import ProfileBase
from autotune.progress import say, step
from autotune.workspace import Workspace


def bench_profile(
    path: Path,
    prompts: str | None,
    max_new_tokens: int,
    model_path: str | None = None,
    dtype: str = "auto",
    device: str = "auto",
) -> dict:
    """Every method of the profile (as deployed: with CAPE where it is enabled) against one
    plain greedy decoding per prompt, interleaved; keyed by method, with ``recommended``
    (the profile's) and ``recommended_holds`` (its interval here clears the profile's
    margin). ``dtype`` auto: the profile's own."""
    profile, ws, env = open_profile(path, prompts, max_new_tokens, model_path, dtype, device)
    encoded = ws.encode(ws.prompts if prompts else ws.heldback_prompts())
    makers = {
        name: registry.method(name).variant(block, env)
        for name, block in profile.method_blocks().items()
    }
    with step("bench: every method against plain greedy", len(encoded) * len(makers)) as advance:
        measured = measure_variants(
            ws.runner, makers, encoded, max_new_tokens, on_prompt=lambda _: advance()
        )
    results: dict[str, object] = {  # every figure here is autotune's engine's
        name: {**m.summary(), "measured_in": AUTOTUNE_ENGINE, "per_prompt": m.per_prompt()}
        for name, m in measured.items()
    }
    margin = profile.verdict.margin if profile.verdict is not None else 0.0
    top = measured.get(profile.recommended)
    results["recommended"] = profile.recommended
    results["recommended_holds"] = top is not None and top.interval().above(1.0 + margin)
    return results


def open_profile(
    path: Path,
    prompts: str | None,
    max_new_tokens: int,
    model_path: str | None,
    dtype: str,
    device: str,
) -> tuple[ProfileBase, Workspace, DraftEnv]:
    """The profile, a workspace over its model (found as ``find_model`` says) and the
    prompts (the profile's own file by default), and the environment its drafters need."""
    from autotune.models.loading import placement

    profile = read_profile(Path(path))
    missing = profile.missing()
    if missing:
        raise AutotuneError(f"{path}: {missing[0]}")
    dtype, device = placement(profile.model.dtype if dtype == "auto" else dtype, device)
    if model_path is not None:
        ref = TargetRef.for_user(profile.model.name, model_path, dtype, device)
    else:
        ref = TargetRef.for_user(find_model(profile.model), None, dtype, device)
    prompts_file = prompts or profile_prompts(profile)
    ws = Workspace.open(ref, prompts_file, storage=None, need_storage=False)
    ws.check_context(max_new_tokens)
    if ws.target.fingerprint != profile.model.fingerprint:
        say(
            f"[yellow]warning: model fingerprint {ws.target.fingerprint} differs from the "
            f"profile's {profile.model.fingerprint}[/yellow]"
        )
    return profile, ws, DraftEnv(ws.ref, ws.runner, Path(path).resolve().parent)


def bench_load(
    path: Path,
    levels: tuple[int, ...],
    prompts: str | None,
    max_new_tokens: int,
    rounds: int,
    model_path: str | None = None,
    dtype: str = "auto",
    device: str = "auto",
    engine: str | None = None,
) -> dict:
    """The profile's recommended method with several requests in flight: at each level,
    the setting its load block schedules there (the tuned one where it has none) and the
    tuned setting, against plain decoding of the same rounds (``measure.load``).
    ``engine``: that engine's own setting instead (the one its export writes, drafting by
    its rule), capped per level as the export caps it."""
    from autotune.measure.load import in_engine, measure_level
    from autotune.measure.ties import lossless_up_to_a_tie

    profile, ws, env = open_profile(path, prompts, max_new_tokens, model_path, dtype, device)
    name = profile.recommended
    settings = profile.block(name)
    if settings is None:
        raise AutotuneError(
            f"{path} recommends no method (recommended: {name}): there is nothing to "
            "measure under load"
        )
    method = registry.method(name)
    if engine is not None:
        settings = engine_setting(method, settings, engine)
    caps = {
        level.concurrency: level.max_draft_tokens
        for level in (settings.load.levels if settings.load else [])
    }
    encoded = ws.encode(ws.prompts if prompts else ws.heldback_prompts())
    ids = [p.ids for p in categories_in_turn(encoded, len(encoded))]
    rows = []
    for concurrency in levels:
        pick, chosen = _level_settings(method, settings, caps.get(concurrency))
        makers = {n: method.variant(s, env).make for n, s in chosen.items()}
        with step(f"bench: {name} with {concurrency} requests in flight", rounds) as advance:
            level = measure_level(
                in_engine(ws.runner, max_new_tokens, makers),
                sorted(chosen),
                ids,
                concurrency,
                rounds,
                on_round=lambda _: advance(),
                same=lossless_up_to_a_tie(ws.runner),
            )
        row: dict = {"concurrency": concurrency, "scheduled": pick, "rounds": level.rounds}
        row.update({n: figure.summary() for n, figure in level.figures.items()})
        rows.append(row)
    return {
        "method": name,
        "engine": engine,
        "measured_in": by_rule(engine) if engine is not None else AUTOTUNE_ENGINE,
        "max_new_tokens": max_new_tokens,
        "levels": rows,
    }


def _level_settings(method, settings, cap: int | None) -> tuple[str, dict]:
    """At a level whose load block caps drafts at ``cap`` (0: off; None: no cap there):
    the label of the setting scheduled there, and the settings measured, by label (the
    tuned one always, the capped one where the cap shrinks it). A cap at or above the
    setting's own draft size leaves the setting as it is."""
    from autotune.measure.load import OFF, TUNED, label_of

    size = method.draft_size(settings)
    shrinks = cap is not None and size is not None and 0 < cap < size
    smaller = method.capped(settings, cap) if cap is not None and shrinks else None
    pick = OFF if cap == 0 else TUNED if smaller is None else label_of(cap)
    return pick, {TUNED: settings} | ({pick: smaller} if smaller is not None else {})


def engine_setting(method, settings, engine: str):
    """The setting ``engine``'s export serves (``Method.for_engine``), or an error that
    says which engines can serve the method."""
    from autotune.export import check_engine

    engine = check_engine(engine)
    if engine not in method.exporters:
        raise AutotuneError(
            f"{engine} cannot serve {method.name}; engines that can: "
            f"{', '.join(method.exporters) or 'none'}"
        )
    return method.for_engine(settings, engine)


def find_model(info: ModelInfo) -> str:
    """The profile's model on this machine, as a model spec: the first of its alias, its
    repo's snapshot at the profile's revision, its repo id (in the local hub cache) and
    its path that is here with the profile's fingerprint; else the first that is here at
    all (bench then warns that the fingerprint differs)."""
    from autotune.models import fingerprint, resolve_model

    tried = list(
        dict.fromkeys(s for s in (info.name, _at_revision(info), info.repo, info.path) if s)
    )
    present = []
    for spec in tried:
        try:
            resolved = resolve_model(spec)
        except ModelNotFoundError:
            continue
        if fingerprint(resolved) == info.fingerprint:
            return spec
        present.append(spec)
    if present:
        return present[0]
    raise ModelNotFoundError(
        f"the profile's model {info.name} (fingerprint {info.fingerprint}) is not on this "
        f"machine (looked for {', '.join(tried)}): "
        "pass --model-path with its local folder or .gguf file"
    )


def _at_revision(info: ModelInfo) -> str | None:
    """The hub-cache snapshot of the profile's repo at its revision, where it is here."""
    from autotune.models.hub import repo_folder

    if info.repo is None or info.revision is None:
        return None
    snapshot = repo_folder(info.repo) / "snapshots" / info.revision
    return str(snapshot) if snapshot.is_dir() else None


def profile_prompts(profile: ProfileBase) -> str:
    """The profile's prompts file on this machine (``workload_prompts``), with a warning
    where its content is not the profile's (its sha256 differs)."""
    from autotune.profile.travel import file_sha256

    found = workload_prompts(profile.workload.prompts)
    recorded = profile.workload.prompts_sha256
    if recorded is not None and file_sha256(found) != recorded:
        say(
            f"[yellow]warning: {found} is not the prompts file the profile was made with "
            f"(sha256 {recorded[:12]}...): its held-back split may differ[/yellow]"
        )
    return found


def workload_prompts(recorded: str) -> str:
    """The profile's prompts file: as read (``profile.travel``: beside the profile, or the
    packaged file of that name in this installation), else the same packaged file of
    this installation (a path recorded by an older profile); where none is here, one line
    saying what is missing and how to point at it."""
    from autotune.prompts import packaged_prompt_files

    if Path(recorded).is_file():
        return recorded
    same = [f for f in packaged_prompt_files() if f.name == Path(recorded).name]
    if same:
        return str(same[0])
    raise AutotuneError(
        f"the profile's prompts file {recorded} is not on this machine: pass --prompts "
        f"FILE, or copy {Path(recorded).name} beside the profile"
    )
