"""JSON schemas from Python signatures, and validation of tool arguments against them.

A tool is a plain function with type hints and a Google-style docstring; its schema is
derived, never written by hand, so the schema cannot drift from the code:

- ``str``/``int``/``float``/``bool`` map to the JSON types;
- ``Optional[X]`` and ``Union[...]`` become ``anyOf`` (with ``null`` for optionals);
- ``Literal[...]`` becomes an ``enum``;
- ``list[X]`` becomes an array with ``items``;
- a dataclass becomes a ``$defs`` entry referenced with ``$ref``;
- ``Annotated[X, Range(lo, hi)]`` adds ``minimum``/``maximum`` to X's schema.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import types
import typing
from typing import Any, Callable


@dataclasses.dataclass(frozen=True)
class Range:
    """Inclusive numeric bounds for an ``Annotated`` parameter."""

    minimum: float | None = None
    maximum: float | None = None


class SchemaError(TypeError):
    """A signature uses a type the generator cannot express."""


class ArgumentError(ValueError):
    """Tool arguments do not match the tool's schema."""


_SCALARS = {str: "string", int: "integer", float: "number", bool: "boolean"}
_ARG_LINE = re.compile(r"^\s+(\w+)(?:\s*\([^)]*\))?:\s*(.*)$")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """The summary paragraph and the per-argument descriptions of a Google-style docstring."""
    if not doc:
        return "", {}
    lines = inspect.cleandoc(doc).splitlines()
    summary: list[str] = []
    params: dict[str, str] = {}
    section = "summary"
    current: str | None = None
    param_indent = 0
    for line in lines:
        stripped = line.strip()
        if stripped in ("Args:", "Arguments:", "Attributes:", "Returns:", "Raises:"):
            section = "args" if stripped in ("Args:", "Arguments:", "Attributes:") else "other"
            current = None
            continue
        if section == "summary":
            summary.append(stripped)
        elif section == "args":
            indent = len(line) - len(line.lstrip())
            match = _ARG_LINE.match(line)
            if match and (current is None or indent <= param_indent):
                current, param_indent = match.group(1), indent
                params[current] = match.group(2).strip()
            elif current and stripped:
                params[current] += " " + stripped
    text = " ".join(" ".join(summary).split())
    return text, params


class SchemaBuilder:
    """Builds one function's parameter schema, collecting dataclass definitions."""

    def __init__(self) -> None:
        self.defs: dict[str, dict[str, Any]] = {}

    def for_type(self, hint: Any) -> dict[str, Any]:
        origin = typing.get_origin(hint)
        args = typing.get_args(hint)
        if origin is typing.Annotated:
            schema = self.for_type(args[0])
            for extra in args[1:]:
                if isinstance(extra, Range):
                    if extra.minimum is not None:
                        schema["minimum"] = extra.minimum
                    if extra.maximum is not None:
                        schema["maximum"] = extra.maximum
            return schema
        if hint in _SCALARS:
            return {"type": _SCALARS[hint]}
        if hint is type(None):
            return {"type": "null"}
        if origin in (typing.Union, types.UnionType):
            return {"anyOf": [self.for_type(member) for member in args]}
        if origin is typing.Literal:
            kinds = {type(a) for a in args}
            if len(kinds) != 1 or next(iter(kinds)) not in _SCALARS:
                raise SchemaError(f"Literal values must share one scalar type: {args}")
            return {"type": _SCALARS[next(iter(kinds))], "enum": list(args)}
        if origin in (list, typing.List):
            if not args:
                raise SchemaError("list parameters need an element type, e.g. list[str]")
            return {"type": "array", "items": self.for_type(args[0])}
        if dataclasses.is_dataclass(hint):
            name = hint.__name__
            if name not in self.defs:
                self.defs[name] = {}  # placeholder first: a self-referencing dataclass terminates
                self.defs[name] = self.for_dataclass(hint)
            return {"$ref": f"#/$defs/{name}"}
        raise SchemaError(f"unsupported parameter type {hint!r}")

    def for_dataclass(self, cls: type) -> dict[str, Any]:
        summary, docs = parse_docstring(cls.__doc__)
        hints = typing.get_type_hints(cls, include_extras=True)
        properties, required = {}, []
        for f in dataclasses.fields(cls):
            prop = self.for_type(hints[f.name])
            if f.name in docs:
                prop["description"] = docs[f.name]
            properties[f.name] = prop
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                required.append(f.name)
        schema: dict[str, Any] = {"type": "object", "properties": properties, "required": required, "additionalProperties": False}
        if summary:
            schema["description"] = summary
        return schema


def function_schema(func: Callable[..., Any]) -> dict[str, Any]:
    """The OpenAI ``function`` entry for ``func`` (name, description, parameters)."""
    summary, docs = parse_docstring(func.__doc__)
    hints = typing.get_type_hints(func, include_extras=True)
    builder = SchemaBuilder()
    properties, required = {}, []
    for name, param in inspect.signature(func).parameters.items():
        if name == "self":
            continue
        if name not in hints:
            raise SchemaError(f"{func.__qualname__}: parameter {name!r} has no type hint")
        prop = builder.for_type(hints[name])
        if name in docs:
            prop["description"] = docs[name]
        properties[name] = prop
        if param.default is inspect.Parameter.empty:
            required.append(name)
    parameters: dict[str, Any] = {"type": "object", "properties": properties, "required": required, "additionalProperties": False}
    if builder.defs:
        parameters["$defs"] = builder.defs
    return {"name": func.__name__, "description": summary, "parameters": parameters}


def resolve_ref(root: dict[str, Any], ref: str) -> dict[str, Any]:
    if not ref.startswith("#/"):
        raise ArgumentError(f"only local references are supported, got {ref!r}")
    node: Any = root
    for part in ref[2:].split("/"):
        if not isinstance(node, dict) or part not in node:
            raise ArgumentError(f"unresolvable reference {ref!r}")
        node = node[part]
    return node


_TYPE_TESTS: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
}


def validate(value: Any, schema: dict[str, Any], root: dict[str, Any], path: str = "$", refs: tuple[str, ...] = ()) -> None:
    """Raise :class:`ArgumentError` naming the first place where ``value`` breaks ``schema``."""
    if "$ref" in schema:
        ref = schema["$ref"]
        if ref in refs:  # a reference cycle that consumed no input: nothing more to check
            return
        validate(value, resolve_ref(root, ref), root, path, refs + (ref,))
        return
    if "anyOf" in schema:
        problems = []
        for option in schema["anyOf"]:
            try:
                validate(value, option, root, path, refs)
                return
            except ArgumentError as exc:
                problems.append(str(exc))
        raise ArgumentError(f"{path}: {value!r} matches none of the allowed forms ({'; '.join(problems)})")
    kind = schema.get("type")
    if kind is not None and not _TYPE_TESTS[kind](value):
        raise ArgumentError(f"{path}: {value!r} is not of type {kind!r}")
    if "enum" in schema and value not in schema["enum"]:
        raise ArgumentError(f"{path}: {value!r} is not one of {schema['enum']}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            raise ArgumentError(f"{path}: {value} is less than the minimum of {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            raise ArgumentError(f"{path}: {value} is greater than the maximum of {schema['maximum']}")
    if kind == "array":
        for i, item in enumerate(value):
            validate(item, schema.get("items", {}), root, f"{path}[{i}]")
    if kind == "object":
        properties = schema.get("properties", {})
        for name in schema.get("required", []):
            if name not in value:
                raise ArgumentError(f"{path}: required property {name!r} is missing")
        for name, item in value.items():
            if name in properties:
                validate(item, properties[name], root, f"{path}.{name}")
            elif schema.get("additionalProperties") is False:
                raise ArgumentError(f"{path}: unexpected property {name!r}")


def drop_null_optionals(arguments: dict[str, Any], parameters: dict[str, Any]) -> dict[str, Any]:
    """Treat an explicit ``null`` for an optional parameter as "not given".

    Models often spell out every parameter and fill the ones they do not need with null;
    the function's own default is what they mean.
    """
    required = set(parameters.get("required", []))
    return {k: v for k, v in arguments.items() if v is not None or k in required}
