"""Extracting a JSON object from model text that may wrap it in markdown.

Models (and the scripted server) return structured output bare, inside a ```json fence, inside
an unlabelled fence, or after a sentence of prose. The extractor tries those shapes in order
and reports where it looked when none parses, so a parse failure in a trace says why.
"""

from __future__ import annotations

import json
import re
from typing import Any

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\r?\n(.*?)\r?\n?```", re.DOTALL)


class JSONExtractError(ValueError):
    """No JSON object could be found in the text."""


def _loads_object(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def _balanced_objects(text: str):
    """Yields every top-level `{...}` substring, respecting strings and escapes."""
    depth, start, in_string, escaped = 0, -1, False, False
    for i, ch in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
            continue
        if ch == '"' and depth > 0:
            in_string = True
        elif ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}" and depth > 0:
            depth -= 1
            if depth == 0:
                yield text[start : i + 1]


def extract_json(text: str | None) -> dict[str, Any]:
    """The first JSON object in `text`: bare, fenced (```json or ```), or embedded in prose."""
    if text is None or not text.strip():
        raise JSONExtractError("the reply is empty")
    stripped = text.strip().lstrip("\ufeff")
    found = _loads_object(stripped)
    if found is not None:
        return found
    fences = _FENCE.findall(stripped)
    # Labelled json fences first, then any other fence.
    for label, body in sorted(fences, key=lambda f: f[0].lower() != "json"):
        found = _loads_object(body.strip())
        if found is not None:
            return found
    for candidate in _balanced_objects(stripped):
        found = _loads_object(candidate)
        if found is not None:
            return found
    preview = stripped[:120].replace("\n", "\\n")
    raise JSONExtractError(
        f"no JSON object found in {len(stripped)} characters "
        f"({len(fences)} fenced block(s) tried); the reply starts: {preview!r}"
    )
