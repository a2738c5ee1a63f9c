"""JSON schemas of the tools' parameters and the validator that checks calls against them.

The validator covers the subset the tool schemas use: `type` (one name or a list, so
`["integer", "null"]` unions), `anyOf`, `enum`, `properties`/`required`/
`additionalProperties`, array `items`, `minimum`/`maximum`, `minLength`, and local `$ref`s
into `$defs`. It returns the arguments normalised for execution: optional fields sent as
`null` are dropped, enum values are matched case-insensitively and replaced by their
canonical spelling, and whole-number floats become integers where an integer is expected.
"""

from __future__ import annotations

from typing import Any


class SchemaError(ValueError):
    """The schema itself is broken (unresolvable or cyclic `$ref`)."""


class ValidationError(ValueError):
    """Arguments do not match the schema; `path` is a JSON pointer to the offending value."""

    def __init__(self, path: str, message: str):
        super().__init__(f"{path or '/'}: {message}")
        self.path = path


MAX_REF_DEPTH = 16

_TYPE_CHECKS = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def resolve_ref(root: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    """Follows `$ref` chains from `node` to a concrete schema, refusing cycles."""
    seen: list[str] = []
    while "$ref" in node:
        ref = node["$ref"]
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise SchemaError(f"only local $refs are supported, got {ref!r}")
        if ref in seen or len(seen) >= MAX_REF_DEPTH:
            raise SchemaError(f"$ref cycle: {' -> '.join(seen + [ref])}")
        seen.append(ref)
        target: Any = root
        for part in [p for p in ref[1:].split("/") if p]:
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(target, dict) or part not in target:
                raise SchemaError(f"$ref {ref!r} does not resolve")
            target = target[part]
        if not isinstance(target, dict):
            raise SchemaError(f"$ref {ref!r} does not point at a schema")
        node = target
    return node


def validate(args: Any, schema: dict[str, Any]) -> Any:
    """Checks `args` against `schema` and returns the normalised arguments."""
    return _validate(args, schema, schema, "")


def _types(node: dict[str, Any]) -> list[str]:
    declared = node.get("type")
    if declared is None:
        return []
    return [declared] if isinstance(declared, str) else list(declared)


def _validate(value: Any, node: dict[str, Any], root: dict[str, Any], path: str) -> Any:
    node = resolve_ref(root, node)
    if "anyOf" in node:
        problems = []
        for option in node["anyOf"]:
            try:
                return _validate(value, option, root, path)
            except ValidationError as exc:
                problems.append(str(exc))
        raise ValidationError(
            path, "matches none of the allowed shapes (" + "; ".join(problems) + ")")
    types = _types(node)
    if types:
        if "integer" in types and isinstance(value, float) and value.is_integer():
            value = int(value)
        if not any(_TYPE_CHECKS[t](value) for t in types if t in _TYPE_CHECKS):
            raise ValidationError(path, f"expected {' or '.join(types)}, got {_json_type(value)}")
    if "enum" in node:
        value = _match_enum(value, node["enum"], path)
    if isinstance(value, str):
        if len(value) < node.get("minLength", 0):
            raise ValidationError(path, f"must be at least {node['minLength']} characters")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in node and value < node["minimum"]:
            raise ValidationError(path, f"must be >= {node['minimum']}, got {value}")
        if "maximum" in node and value > node["maximum"]:
            raise ValidationError(path, f"must be <= {node['maximum']}, got {value}")
    if isinstance(value, dict):
        return _validate_object(value, node, root, path)
    if isinstance(value, list):
        items = node.get("items")
        if items is None and "array" in types:
            raise SchemaError(f"{path or '/'}: array schema without items")
        if "maxItems" in node and len(value) > node["maxItems"]:
            raise ValidationError(path, f"at most {node['maxItems']} items allowed")
        return [_validate(v, items, root, f"{path}/{i}") for i, v in enumerate(value)]
    return value


def _validate_object(value: dict[str, Any], node: dict[str, Any], root: dict[str, Any],
                     path: str) -> dict[str, Any]:
    properties: dict[str, Any] = node.get("properties", {})
    required = set(node.get("required", []))
    out: dict[str, Any] = {}
    for key, item in value.items():
        if key not in properties:
            if node.get("additionalProperties", True) is False:
                raise ValidationError(f"{path}/{key}", f"unknown argument {key!r}; allowed: "
                                      + ", ".join(sorted(properties)))
            out[key] = item
            continue
        # An optional argument sent as null means "not given".
        if item is None and key not in required and "null" not in _types(
            resolve_ref(root, properties[key])
        ):
            continue
        out[key] = _validate(item, properties[key], root, f"{path}/{key}")
    for key in sorted(required):
        if key not in out:
            raise ValidationError(f"{path}/{key}", "required argument missing")
    return out


def _match_enum(value: Any, allowed: list[Any], path: str) -> Any:
    if value in allowed:
        return value
    if isinstance(value, str):
        folded = value.strip().casefold()
        for option in allowed:
            if isinstance(option, str) and option.casefold() == folded:
                return option
    raise ValidationError(path, f"{value!r} is not one of {allowed!r}")


def _json_type(value: Any) -> str:
    for name in ("null", "boolean", "integer", "number", "string", "array", "object"):
        if _TYPE_CHECKS[name](value):
            return name
    return type(value).__name__


def search_parameters() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "query": {
                "type": "string",
                "minLength": 1,
                "description": "Keywords to look for; words like 'the' and 'what' are ignored.",
            },
            "limit": {
                "type": ["integer", "null"],
                "minimum": 1,
                "maximum": 10,
                "description": "How many documents to return (default 5).",
            },
        },
        "required": ["query"],
        "additionalProperties": False,
    }


def read_file_parameters() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "path": {
                "type": "string",
                "minLength": 1,
                "description": "Corpus-relative path as returned by search, e.g. "
                               "'harrowmere/history.md' or 'tables/products.csv'.",
            }
        },
        "required": ["path"],
        "additionalProperties": False,
    }


def table_lookup_parameters(tables: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "table": {
                "type": "string",
                "enum": tables,
                "description": "The table's name, as the documents mention it.",
            },
            "where": {
                "$ref": "#/$defs/filter",
                "description": "Keep only rows whose column matches; omit for all rows.",
            },
            "columns": {
                "type": "array",
                "items": {"type": "string"},
                "maxItems": 12,
                "description": "Columns to return, in this order; omit for all columns.",
            },
        },
        "required": ["table"],
        "additionalProperties": False,
        "$defs": {
            "filter": {
                "type": "object",
                "properties": {
                    "column": {"type": "string", "description": "Column to filter on."},
                    "value": {
                        "anyOf": [{"type": "string"}, {"type": "number"}],
                        "description": "Value to match; numbers match numerically (64.5 = 64.50).",
                    },
                    "match": {
                        "type": "string",
                        "enum": ["exact", "contains"],
                        "description": "'exact' (default, case-insensitive) or 'contains'.",
                    },
                },
                "required": ["column", "value"],
                "additionalProperties": False,
            }
        },
    }


def calculator_parameters() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "expression": {
                "type": "string",
                "minLength": 1,
                "description": "Arithmetic with + - * / // % **, parentheses and round, abs, "
                               "min, max, sum, sqrt, e.g. 'round(12400000 / 86)'.",
            }
        },
        "required": ["expression"],
        "additionalProperties": False,
    }
