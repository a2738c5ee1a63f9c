"""A JSON Schema subset for tool parameters: what function-calling schemas actually use.

Supported: `type` (one name or a list: a union), `enum`, `const`, `properties`, `required`
(everything else optional), `additionalProperties`, `items`, `minItems`/`maxItems`,
`minimum`/`maximum`, `minLength`/`maxLength`, `anyOf`/`oneOf`/`allOf`, local `$ref`
(`#/$defs/...`), and `default` (applied by `apply_defaults`, never by `validate`).
"""

from __future__ import annotations

import copy
from typing import Any

_TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


class SchemaError(Exception):
    """The schema itself is broken (unknown type, unresolvable `$ref`)."""


def resolve_ref(root: dict[str, Any], ref: str) -> dict[str, Any]:
    if not ref.startswith("#"):
        raise SchemaError(f"only local references are supported, got {ref!r}")
    node: Any = root
    for part in [p for p in ref[1:].split("/") if p]:
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, dict) or part not in node:
            raise SchemaError(f"unresolvable reference {ref!r}")
        node = node[part]
    return node


def _type_names(schema: dict[str, Any]) -> list[str]:
    t = schema.get("type")
    if t is None:
        return []
    names = t if isinstance(t, list) else [t]
    for name in names:
        if name not in _TYPES:
            raise SchemaError(f"unknown type {name!r}")
    return names


def validate(value: Any, schema: dict[str, Any] | bool, root: dict[str, Any] | None = None,
             path: str = "$") -> list[str]:
    """Every way `value` violates `schema`, each as 'path: reason'. Empty means valid."""
    if schema is True or schema == {}:
        return []
    if schema is False:
        return [f"{path}: no value is allowed here"]
    root = root if root is not None else schema
    if "$ref" in schema:
        target = resolve_ref(root, schema["$ref"])
        rest = {k: v for k, v in schema.items() if k != "$ref"}
        return validate(value, target, root, path) + (validate(value, rest, root, path) if rest else [])
    errors: list[str] = []
    names = _type_names(schema)
    if names and not any(_TYPES[n](value) for n in names):
        wanted = " or ".join(names)
        return [f"{path}: expected {wanted}, got {_describe(value)}"]
    if "enum" in schema and value not in schema["enum"]:
        options = ", ".join(repr(o) for o in schema["enum"])
        errors.append(f"{path}: {value!r} is not one of {options}")
    if "const" in schema and value != schema["const"]:
        errors.append(f"{path}: must be {schema['const']!r}")
    if isinstance(value, str):
        if "minLength" in schema and len(value) < schema["minLength"]:
            errors.append(f"{path}: shorter than {schema['minLength']} characters")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            errors.append(f"{path}: longer than {schema['maxLength']} characters")
    if _TYPES["number"](value):
        if "minimum" in schema and value < schema["minimum"]:
            errors.append(f"{path}: {value} is less than the minimum {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            errors.append(f"{path}: {value} is greater than the maximum {schema['maximum']}")
    if isinstance(value, dict):
        props = schema.get("properties", {})
        for key in schema.get("required", []):
            if key not in value:
                errors.append(f"{path}: missing required property {key!r}")
        extra = schema.get("additionalProperties", True)
        for key, item in value.items():
            if key in props:
                errors += validate(item, props[key], root, f"{path}.{key}")
            elif extra is False:
                errors.append(f"{path}: unexpected property {key!r}")
            elif isinstance(extra, dict):
                errors += validate(item, extra, root, f"{path}.{key}")
    if isinstance(value, list):
        if "minItems" in schema and len(value) < schema["minItems"]:
            errors.append(f"{path}: fewer than {schema['minItems']} items")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            errors.append(f"{path}: more than {schema['maxItems']} items")
        if "items" in schema:
            for i, item in enumerate(value):
                errors += validate(item, schema["items"], root, f"{path}[{i}]")
    if "allOf" in schema:
        for sub in schema["allOf"]:
            errors += validate(value, sub, root, path)
    if "anyOf" in schema:
        if not any(not validate(value, sub, root, path) for sub in schema["anyOf"]):
            errors.append(f"{path}: {_describe(value)} matches none of the allowed forms")
    if "oneOf" in schema:
        matches = sum(1 for sub in schema["oneOf"] if not validate(value, sub, root, path))
        if matches != 1:
            errors.append(f"{path}: must match exactly one allowed form, matches {matches}")
    return errors


def apply_defaults(value: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """A copy of `value` with the top-level `default`s of absent optional properties."""
    out = copy.deepcopy(value)
    for key, prop in schema.get("properties", {}).items():
        if key not in out and isinstance(prop, dict) and "default" in prop:
            out[key] = copy.deepcopy(prop["default"])
    return out


def _describe(value: Any) -> str:
    for name in ("null", "boolean", "integer", "number", "string", "array", "object"):
        if _TYPES[name](value):
            return name
    return type(value).__name__
