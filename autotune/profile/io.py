"""Reading and writing profiles as YAML, never leaving a half-written file."""

from __future__ import annotations

import re
import types
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from autotune.errors import AutotuneError
from autotune.files import check_writable as check_writable  # profiling's check, before work
from autotune.files import write_atomic
from autotune.profile import layout, travel
from autotune.profile.blocks import field_names
from autotune.profile.schema import SCHEMA, ProfileBase, profile_model

_SCHEMA_VERSION = re.compile(r"autotune/profile@(\d+)")
_READ_VERSION = int(SCHEMA.rsplit("@", 1)[1])


class ProfileInvalidError(AutotuneError):
    """The profile breaks the schema. ``problems`` names each wrong field (its dotted path
    in the YAML), what it holds, and what it should be: one line each."""

    def __init__(self, path: Path, problems: list[str]):
        self.path, self.problems = path, problems
        super().__init__(f"profile {path} is invalid: " + "; ".join(problems))


def write_profile(profile: ProfileBase, path: Path) -> None:
    """The profile as YAML, made to travel (``profile.travel``: no path of this machine
    in it) and laid out for deploying first (``profile.layout``). Written whole or not at
    all (``autotune.files``)."""
    data = profile.model_dump(mode="json", by_alias=True)
    travel.portable(data, path.parent)
    text = yaml.safe_dump(layout.split(data), sort_keys=False)
    write_atomic(path, layout.with_comment(text))


def read_profile(path: Path) -> ProfileBase:
    """The profile at ``path``, with this machine's paths (what it names and is not here
    is kept on the profile: ``ProfileBase.missing``)."""
    if not path.is_file():
        raise AutotuneError(f"profile {path} not found; write one with `autotune profile`")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise AutotuneError(
            f"profile {path} is not valid YAML: {str(exc).splitlines()[0]}"
        ) from None
    if not isinstance(data, dict):
        raise AutotuneError(f"profile {path} is not a mapping; expected schema {SCHEMA}")
    _check_schema(path, data.get("schema"))
    diagnostics = data.get(layout.DIAGNOSTICS)
    data = layout.merged(data)
    missing = travel.local(data, path.parent)
    try:
        profile = profile_model().model_validate(data)
    except ValidationError as exc:
        problems = [layout.where_written(p, diagnostics) for p in describe_errors(exc)]
        raise ProfileInvalidError(path, problems) from None
    profile._missing = missing
    return profile


def _check_schema(path: Path, schema) -> None:
    """Only this schema is read; a newer one says so, so the user knows to upgrade."""
    if schema == SCHEMA:
        return
    if schema is None:
        raise AutotuneError(f"profile {path} has no 'schema' field; expected schema: {SCHEMA}")
    match = _SCHEMA_VERSION.fullmatch(str(schema))
    if match and int(match[1]) > _READ_VERSION:
        raise AutotuneError(
            f"profile {path} has schema {schema}: it was written by a newer "
            f"autotune; upgrade autotune to read it (this one reads {SCHEMA})"
        )
    raise AutotuneError(
        f"profile {path} has schema {schema!r}, which is not a schema this "
        f"autotune knows; expected schema: {SCHEMA}"
    )


# --- naming what is wrong --------------------------------------------------------------


def describe_errors(exc: ValidationError) -> list[str]:
    """One line per wrong field: ``dotted.path: got VALUE; MESSAGE (expected: WHAT)``."""
    return [_describe(error) for error in exc.errors()]


def _describe(error: Any) -> str:
    where, annotation, field, owner = _locate(error["loc"])
    got = "missing" if error["type"] == "missing" else f"got {_short(error.get('input'))}"
    if error["type"] == "extra_forbidden" and owner is not None:
        fields = ", ".join(field_names(owner))
        return f"{where}: {got}; not a field here (expected one of: {fields})"
    message = error["msg"].removeprefix("Value error, ")
    expected = ""
    # a model validator's message already says what is wrong with the block as a whole
    if annotation is not None and not (error["type"] == "value_error" and _model_of(annotation)):
        expected = f" (expected: {_expected(annotation, field)})"
    return f"{where or '(top level)'}: {got}; {message}{expected}"


def _locate(loc: tuple) -> tuple[str, object, object, type[BaseModel] | None]:
    """The YAML path of a pydantic error location, the type expected there, the schema
    field when the path ends on one (for its constraints), and the model holding it.
    Union tags (``static``) are pydantic's, not the YAML's: they choose the member model
    and are left out of the path."""
    model: type[BaseModel] | None = profile_model()
    annotation, field, owner, path = None, None, None, ""
    for item in loc:
        if isinstance(item, int):
            path += f"[{item}]"
            annotation, field = _element(annotation), None
            model = _model_of(annotation)
            continue
        member = _union_member(annotation, item)
        if member is not None:
            model = member
            continue
        name = _field_name(model, item) if model is not None else None
        path += f".{item}" if path else str(item)
        if name is None or model is None:
            # an extra key, or a key of a free-form mapping: nothing more to know
            owner = model
            annotation, field, model = _value_type(annotation), None, None
            continue
        owner, field = model, model.model_fields[name]
        annotation = field.annotation
        model = _model_of(annotation)
    return path, annotation, field, owner


def _field_name(model: type[BaseModel], key: str) -> str | None:
    for name, info in model.model_fields.items():
        if key in (name, info.alias):
            return name
    return None


def _members(annotation) -> tuple:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return typing.get_args(annotation)
    return (annotation,)


def _model_of(annotation) -> type[BaseModel] | None:
    models = [m for m in _members(annotation) if isinstance(m, type) and issubclass(m, BaseModel)]
    return models[0] if len(models) == 1 else None


def _union_member(annotation, tag) -> type[BaseModel] | None:
    """The member of a tagged union (``kind: static | dynamic``) that ``tag`` names."""
    members = [m for m in _members(annotation) if isinstance(m, type) and issubclass(m, BaseModel)]
    if len(members) < 2:
        return None
    for member in members:
        kind = member.model_fields.get("kind")
        if kind is not None and kind.default == tag:
            return member
    return None


def _element(annotation):
    for member in _members(annotation):
        if typing.get_origin(member) is list:
            return typing.get_args(member)[0]
    return None


def _value_type(annotation):
    for member in _members(annotation):
        if typing.get_origin(member) is dict:
            return typing.get_args(member)[1]
    return None


def _expected(annotation, field) -> str:
    """A type and, for a schema field, its bounds in words: ``an integer >= 1``."""
    signs = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}
    bounds = [
        f"{sign} {getattr(constraint, attr)}"
        for constraint in (field.metadata if field is not None else ())
        for attr, sign in signs.items()
        if getattr(constraint, attr, None) is not None
    ]
    return " ".join([_type_words(annotation), " and ".join(bounds)]).strip()


_NAMES = {
    int: ("an integer", "integers"),
    float: ("a number", "numbers"),
    str: ("a string", "strings"),
    bool: ("true or false", "booleans"),
    dict: ("a mapping", "mappings"),
    type(None): ("null", "nulls"),
}


def _type_words(annotation, plural: bool = False) -> str:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_words(m, plural) for m in typing.get_args(annotation))
    if origin is typing.Literal:
        return " or ".join(repr(v) for v in typing.get_args(annotation))
    if origin is list:
        inner = _type_words(typing.get_args(annotation)[0], plural=True)
        return f"{'lists' if plural else 'a list'} of {inner}"
    if origin is dict:
        return "mappings" if plural else "a mapping"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        keys = ", ".join(field_names(annotation))
        return f"{'mappings' if plural else 'a mapping'} with {keys}"
    if annotation in _NAMES:
        return _NAMES[annotation][plural]
    return getattr(annotation, "__name__", str(annotation))


def _short(value, limit: int = 40) -> str:
    if isinstance(value, dict):
        return "a mapping"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
