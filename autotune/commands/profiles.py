"""The commands that read a written profile: its problems (`validate`), and its export
written to files (`export`)."""

from __future__ import annotations

from pathlib import Path

from autotune.export import export_profile
from autotune.export.base import Export, about_path
from autotune.export.serve import serve_command, serving_model
from autotune.files import check_writable, write_atomic
from autotune.profile.io import ProfileInvalidError, read_profile
from autotune.profile.meaning import profile_problems


def problems_in(profile_path: Path) -> list[str]:
    """Each wrong field of the profile at ``profile_path``, with what it should be: its
    shape first, as meaning is read from a well-formed profile."""
    try:
        return profile_problems(read_profile(profile_path))
    except ProfileInvalidError as exc:
        return exc.problems


def export_of(
    profile_path: Path, engine: str, method: str | None, force: bool, out: Path | None
) -> Export:
    """The profile's export for ``engine``; ``out``, when given, checked writable."""
    result = export_profile(read_profile(profile_path), engine, method, force)
    if out is not None:
        check_writable(out)
    return result


def write_export(result: Export, out: Path) -> list[Path]:
    """Write the export to ``out``, with the files beside it, all or none: where a JSON
    file's settings came from (the engine reads its every key, so that is said in a file
    of its own) and the companion file the export points to. The paths, ``out`` first."""
    files = [(out, result.text_for(out))]
    about = about_path(out) if result.about is not None else None
    if about is not None and result.about is not None:
        files.append((about, result.about))
    companion = result.companion_path(out)
    if companion is not None and result.companion is not None:
        files.append((companion, result.companion.text))
    written: list[Path] = []
    try:
        for path, text in files:
            write_atomic(path, text)
            written.append(path)
    except BaseException:
        for path in written:
            path.unlink(missing_ok=True)
        raise
    return written


def serve_line(profile_path: Path, result: Export, out: Path) -> str | None:
    """The command that serves the export written at ``out`` (None: a library's)."""
    return serve_command(result, serving_model(read_profile(profile_path).model), out)
