"""Profiles that travel: what a profile names on the machine that wrote it (the model, the
head folders, the prompts file) written so that another machine or folder finds it, and
found again when the profile is read.

In a written profile:

- the model is named by what identifies it (``name``: an alias or the folder's name;
  ``repo`` and ``revision`` when it came from the Hugging Face hub cache; its
  ``fingerprint``); its ``path`` only where the model sits beside the profile (relative);
- a head folder (Medusa's ``heads``, EAGLE's and GLIDE's ``head``) is a path relative to
  the profile's folder when it lies under it, else ``heads-cache:<fingerprint>/<kind>``
  (autotune's heads cache, ``autotune.paths.cache_root()``), else ``hf:<repo>@<revision>``
  (heads published on the Hub, from the local hub cache), else relative again (heads
  within the profile's folder's parent: ``profiles/`` and ``heads/`` of one project, or
  farther; a folder this machine does not have, named by an older profile, is carried
  as it came);
- the prompts file is named by a path relative to the profile where it lies beside it,
  else by its file name (a packaged one, ``mt_bench.jsonl``, is found in any
  installation), and by its sha256.

Read back, each is an absolute path of this machine again. A head folder that is not
where its reference points may have been copied beside the profile, into ``heads/``
(``<profile folder>/heads/<folder name>``); where neither holds it, the profile keeps
what it could not find, one line each, for `bench`, `export` and `validate` to say.
Old profiles (absolute paths) read as before.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path

HEAD_FIELDS = ("head", "heads")  # the method settings that name a head folder
CACHE_PREFIX = "heads-cache:"
HUB_PREFIX = "hf:"
BESIDE = "heads"  # where heads copied with a profile go: <profile folder>/heads/<name>


# --- written: names another machine can follow ------------------------------------------


def portable(data: dict, folder: Path) -> None:
    """``data`` (a profile as a plain mapping) made to travel from ``folder``, the
    written profile's folder, in place."""
    folder = folder.resolve()
    _change_head_paths(data, lambda _where, head: head_reference(head, folder))
    model, workload = data.get("model"), data.get("workload")
    if isinstance(model, dict):
        _model_identity(model, folder)
    if isinstance(workload, dict) and isinstance(workload.get("prompts"), str):
        workload["prompts"] = prompts_reference(workload["prompts"], folder)


def head_reference(head: str, folder: Path) -> str:
    """How a profile in ``folder`` names the head folder ``head`` (module docstring)."""
    path = Path(head).expanduser()
    if not path.is_absolute():
        return head  # already as a profile names it (relative, or a cache id)
    path = path.resolve()
    if path.is_relative_to(folder):
        return path.relative_to(folder).as_posix()
    cache = heads_cache()
    if path.is_relative_to(cache.resolve()):
        return CACHE_PREFIX + path.relative_to(cache.resolve()).as_posix()
    hub = _hub_name(path)
    if hub is not None:
        return HUB_PREFIX + hub
    if not path.is_dir():
        return head  # not on this machine (an older profile's): carried as it came
    return _relative(path, folder) or head


def _model_identity(model: dict, folder: Path) -> None:
    """The model's repo and revision named where its path shows them (a hub-cache
    snapshot, which any hub cache holding that revision finds); else its path, kept only
    where the model sits beside the profile."""
    path = model.get("path")
    if not path:
        return
    local = Path(path).expanduser()
    repo, revision = hub_identity(local)
    model["repo"] = model.get("repo") or repo
    model["revision"] = model.get("revision") or revision
    if not local.is_absolute():
        return  # relative to the profile already
    relative = _relative(local.resolve(), folder) if repo is None else None
    model["path"] = relative if relative is not None and _near(relative) else None


def hub_identity(path: Path) -> tuple[str | None, str | None]:
    """The repo id and revision of a model loaded from a hub-cache snapshot folder."""
    from autotune.models.hub import repo_of

    repo = repo_of(path) if path.is_absolute() else None
    return repo, (path.name if repo is not None and path.parent.name == "snapshots" else None)


def prompts_reference(prompts: str, folder: Path) -> str:
    """A prompts file beside the profile by its relative path, else by its name."""
    path = Path(prompts).expanduser()
    if not path.is_absolute():
        return prompts
    relative = _relative(path.resolve(), folder)
    return relative if relative is not None and _near(relative) else path.name


def file_sha256(path: str | Path) -> str | None:
    """The file's sha256 in hex, None when it cannot be read."""
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


# --- read: this machine's paths ----------------------------------------------------------


def local(data: dict, folder: Path) -> dict[str, str]:
    """``data`` (a profile as read) with this machine's paths, in place, ``folder`` the
    profile's folder; returns what could not be found, ``methods.<m>.<field>`` -> one
    line saying what is missing and how to point at it."""
    folder = folder.resolve()
    missing: dict[str, str] = {}

    def find(where: str, head: str) -> str:
        found, problem = locate_head(head, folder)
        if problem is not None:
            missing[where] = problem
        return found

    _change_head_paths(data, find)
    model, workload = data.get("model"), data.get("workload")
    if isinstance(model, dict) and isinstance(model.get("path"), str):
        model["path"] = _absolute(model["path"], folder)
    if isinstance(workload, dict) and isinstance(workload.get("prompts"), str):
        workload["prompts"] = locate_prompts(workload["prompts"], folder)
    return missing


def locate_head(head: str, folder: Path) -> tuple[str, str | None]:
    """The head folder a profile in ``folder`` names, as an absolute path, and None; or,
    where it is not here, the path it names and one line saying what is missing and how
    to point at it. An absolute path (an old profile) that is not here is left to what
    loads it, as before."""
    named = _named_head(head, folder)
    beside = folder / BESIDE / Path(head.partition("@")[0]).name
    if not named.is_dir() and beside.is_dir():
        return str(beside), None
    if named.is_dir() or Path(head).expanduser().is_absolute():
        return str(named), None
    return str(named), (
        f"the heads folder {head} is not on this machine: copy it to {beside} (beside the "
        f"profile) or to {named}"
    )


def _named_head(head: str, folder: Path) -> Path:
    if head.startswith(CACHE_PREFIX):
        return heads_cache() / head.removeprefix(CACHE_PREFIX)
    if head.startswith(HUB_PREFIX):
        return _hub_snapshot(head.removeprefix(HUB_PREFIX))
    return Path(_absolute(head, folder))


def locate_prompts(prompts: str, folder: Path) -> str:
    """The prompts file a profile in ``folder`` names: beside the profile, or the
    packaged file of that name in this installation; else as recorded (``bench`` says
    what is missing)."""
    from autotune.prompts import packaged_prompt_files

    path = Path(_absolute(prompts, folder))
    if path.is_file():
        return str(path)
    for candidate in [folder / path.name, *packaged_prompt_files()]:
        if candidate.name == path.name and candidate.is_file():
            return str(candidate)
    return prompts


# --- the parts --------------------------------------------------------------------------


def heads_cache() -> Path:
    """autotune's heads cache: ``<cache root>/heads/<model fingerprint>/<kind>``."""
    from autotune.paths import cache_root

    return cache_root() / "heads"


def _change_head_paths(data: dict, change: Callable[[str, str], str]) -> None:
    """Each head field of each method block, as ``change(where, value)`` says (in place);
    ``where`` is its dotted path. Whole blocks only: the profile's ``methods`` mapping."""
    methods = data.get("methods")
    for name, block in methods.items() if isinstance(methods, dict) else ():
        for key in HEAD_FIELDS if isinstance(block, dict) else ():
            if isinstance(block.get(key), str) and block[key]:
                block[key] = change(f"methods.{name}.{key}", block[key])


def _relative(path: Path, folder: Path) -> str | None:
    """``path`` relative to ``folder`` (POSIX), None where none exists (another drive)."""
    try:
        return Path(os.path.relpath(path, folder)).as_posix()
    except ValueError:
        return None


def _near(relative: str) -> bool:
    """Under the profile's folder, or its parent's (``profiles/`` beside ``models/``)."""
    return Path(relative).parts[:2] != ("..", "..")


def _absolute(text: str, folder: Path) -> str:
    path = Path(text).expanduser()
    return str(path if path.is_absolute() else (folder / path).resolve())


def _hub_name(path: Path) -> str | None:
    """``repo@revision`` of a hub-cache snapshot folder, else None."""
    from autotune.models.hub import repo_of

    repo = repo_of(path) if path.parent.name == "snapshots" else None
    return f"{repo}@{path.name}" if repo is not None else None


def _hub_snapshot(name: str) -> Path:
    """The local snapshot ``repo@revision`` names: that revision, else the repo's
    current one (``snapshot_in``), else where that revision would be."""
    from autotune.models.hub import repo_folder, snapshot_in

    repo, _, revision = name.partition("@")
    exact = repo_folder(repo) / "snapshots" / revision
    if revision and exact.is_dir():
        return exact
    return snapshot_in(repo_folder(repo)) or exact
