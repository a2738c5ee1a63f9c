"""Pulling a JSON object out of model text.

Models wrap JSON in Markdown fences (```json or bare ```), add a sentence before or after
it, or answer with the object alone; all three must yield the same object.
"""

from __future__ import annotations

import json
import re
from typing import Any

_FENCED = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n(.*?)\n?```", re.DOTALL)


class JSONExtractionError(ValueError):
    """No JSON object could be found in the text."""


def extract_json(text: str) -> dict[str, Any]:
    """The first JSON object in ``text``: fenced blocks first, then the bare text."""
    candidates = [body for lang, body in _FENCED.findall(text) if lang.lower() in ("", "json")]
    candidates.append(text)
    decoder = json.JSONDecoder()
    for candidate in candidates:
        stripped = candidate.strip()
        start = stripped.find("{")
        while start != -1:
            try:
                value, _ = decoder.raw_decode(stripped, start)
            except ValueError:
                start = stripped.find("{", start + 1)
                continue
            if isinstance(value, dict):
                return value
            start = stripped.find("{", start + 1)
    raise JSONExtractionError(f"no JSON object found in: {text[:120]!r}")
