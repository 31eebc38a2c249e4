"""The strict config base that the shaping and score-centering configs share (docs/reference/product.md §1.4):
the model settings that refuse unknown keys, NaN, infinities and changes after loading; numbers that refuse
booleans; one-line errors naming the key path, with the closest known key for a misspelling; YAML and JSON
readers that refuse a key written twice.

Needs only pydantic (and PyYAML for files): the command line validates a recipe with it before torch or TRL
are imported.
"""

from __future__ import annotations

import difflib
import json
import types
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationError

#: every config model's settings: unknown keys, NaN and infinities refused; frozen once loaded
STRICT = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)


def not_bool(value: Any) -> Any:
    """Numbers must be numbers: ``true`` is not 1 (pydantic's lax mode would take it)."""
    if isinstance(value, bool):
        raise ValueError("expected a number, got a boolean")
    return value


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the known word closest to ``word`` (case and ``-`` / ``_`` ignored),
    else ``""``."""

    def folded(text: str) -> str:
        return str(text).lower().replace("-", "_")

    by_fold = {folded(k): k for k in known}
    close = difflib.get_close_matches(folded(word), list(by_fold), n=1)
    return f" (did you mean {by_fold[close[0]]!r}?)" if close else ""


def unwrapped(annotation: Any) -> Any:
    """``annotation`` without ``Annotated`` metadata and ``None`` options."""
    while get_origin(annotation) in (Annotated, Union, types.UnionType):
        annotation = next(a for a in get_args(annotation) if a is not type(None))
    return annotation


def _model_at(model: Any, loc: Sequence[Any]) -> type[BaseModel] | None:
    """The pydantic model reached from ``model`` by the key path ``loc`` (None when it is not a model)."""
    for part in loc:
        model = unwrapped(model)
        if get_origin(model) is dict:  # the part is a mapping key, e.g. an agent's name
            model = get_args(model)[1]
            continue
        if not (isinstance(model, type) and issubclass(model, BaseModel)) or part not in model.model_fields:
            return None
        model = model.model_fields[part].annotation
    model = unwrapped(model)
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def config_error(err: ValidationError, prefix: str = "", model: type[BaseModel] | None = None) -> str:
    """One line per failed rule, ``key.path: message``, joined by ``; ``: what a user needs to fix the key.

    With the validated ``model``, an unknown key at any depth is named with the closest key of its level,
    as the command line names a top-level one."""
    parts = []
    for item in err.errors():
        loc = [*([prefix] if prefix else []), *item["loc"]]
        path = ".".join(str(p) for p in loc)
        message = item["msg"].removeprefix("Value error, ")
        level = _model_at(model, item["loc"][:-1]) if model is not None else None
        if item["type"] == "extra_forbidden" and level is not None:
            message = "unknown key" + did_you_mean(str(item["loc"][-1]), level.model_fields)
        head, colon, rest = message.partition(": ")
        sub_key = "." in head and all(part.isidentifier() for part in head.split("."))
        if item["type"] == "value_error" and path and colon and sub_key:  # a block's rule naming its key
            path, message = f"{path}.{head}", rest
        parts.append(f"{path}: {message}" if path else message)
    return "; ".join(parts)


class DuplicateKeyError(ValueError):
    """A YAML mapping or a JSON object writes a key twice (PyYAML and ``json`` would keep the second
    silently)."""


def _unique_key_loader(yaml: Any) -> type:
    """A ``SafeLoader`` that refuses a key written twice in one mapping, naming the key and both lines
    (keys brought in by a ``<<`` merge may be overridden, as YAML intends)."""

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            first: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key, line = self.construct_object(key_node, deep=True), key_node.start_mark.line + 1
                try:
                    if key in first:
                        raise DuplicateKeyError(
                            f"key {key!r} written twice (line {first[key]} and line {line})"
                        )
                    first[key] = line
                except TypeError:  # an unhashable key: PyYAML's own error follows
                    continue
            return super().construct_mapping(node, deep=deep)

    return UniqueKeyLoader


def read_yaml(path: Path) -> Any:
    """The YAML document of ``path``; a missing or unreadable file, a syntax error or a key written twice in
    one mapping is a ``ValueError`` naming the file (and the line, or both lines)."""
    try:
        import yaml
    except ImportError as err:
        raise ImportError(
            "Loading a YAML file needs PyYAML: pip install 'trl-length-plugin[trl]' (or pip install pyyaml)"
        ) from err
    try:
        return yaml.load(path.read_text(), Loader=_unique_key_loader(yaml))
    except OSError as err:
        raise ValueError(f"cannot read {path}: {err.strerror or err}") from None
    except UnicodeDecodeError:
        raise ValueError(f"cannot read {path}: not UTF-8 text") from None
    except DuplicateKeyError as err:
        raise ValueError(f"{path}: {err}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ValueError(f"{path}: not valid YAML{where}: {problem}") from None


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's pairs as a dict; a key written twice is a ``DuplicateKeyError`` naming both values."""
    mapping: dict[str, Any] = {}
    for key, value in pairs:
        if key in mapping:
            first, second = json.dumps(mapping[key]), json.dumps(value)
            raise DuplicateKeyError(f"key {key!r} written twice (values {first} and {second})")
        mapping[key] = value
    return mapping


def read_json(text: str) -> Any:
    """The JSON document ``text``; bad JSON, or a key written twice in one object (the ``json`` module keeps
    the second silently), is a ``ValueError`` naming it, as ``read_yaml`` refuses a YAML key written twice."""
    try:
        return json.loads(text, object_pairs_hook=_unique_pairs)
    except json.JSONDecodeError as err:
        raise ValueError(f"not valid JSON ({err})") from None
