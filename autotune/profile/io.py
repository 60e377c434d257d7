"""Reading and writing profiles as YAML, never leaving a half-written file."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import yaml
from pydantic import ValidationError

from autotune.errors import AutotuneError, OutputPathError
from autotune.profile.schema import SCHEMA, Profile


def check_writable(path: Path) -> None:
    """Fail before any long work if the profile could not be written there."""
    folder = path.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputPathError(f"cannot create {folder}: {exc.strerror}; choose another --out") from None
    if path.is_dir():
        raise OutputPathError(f"{path} is a folder; --out needs a file name such as profile.yaml")
    if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise OutputPathError(f"{path} is not writable; choose another --out")


def write_profile(profile: Profile, path: Path) -> None:
    check_writable(path)
    text = yaml.safe_dump(profile.model_dump(mode="json", by_alias=True), sort_keys=False)
    handle, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w") as stream:
            stream.write(text)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def read_profile(path: Path) -> Profile:
    if not path.is_file():
        raise AutotuneError(f"profile {path} not found; write one with `autotune profile`")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise AutotuneError(f"profile {path} is not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise AutotuneError(f"profile {path} is not a mapping; expected schema {SCHEMA}")
    if data.get("schema") != SCHEMA:
        raise AutotuneError(f"profile {path} has schema {data.get('schema')!r}; this autotune "
                            f"reads {SCHEMA} only (a newer autotune may read it)")
    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        wrong = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:5])
        raise AutotuneError(f"profile {path} is invalid: {wrong}") from None
