"""Getting structured data out of model text: JSON in Markdown, final answers, clean text."""

from __future__ import annotations

import json
import re
import unicodedata
from typing import Any

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\r?\n(.*?)\r?\n?```", re.DOTALL)
_FINAL_ANSWER = re.compile(r"final answer\s*[:：]\s*(.+)", re.IGNORECASE | re.DOTALL)


def extract_json(text: str | None) -> Any | None:
    """The first JSON value in `text`: the whole text, a fenced block (```json or bare ```),
    or the first balanced {...} / [...] span. None when there is none."""
    if not text:
        return None
    stripped = text.strip()
    try:
        return json.loads(stripped)
    except ValueError:
        pass
    for match in _FENCE.finditer(text):
        lang, body = match.group(1).lower(), match.group(2)
        if lang in ("", "json", "json5", "javascript"):
            try:
                return json.loads(body.strip())
            except ValueError:
                continue
    decoder = json.JSONDecoder()
    for i, ch in enumerate(text):
        if ch in "{[":
            try:
                value, _ = decoder.raw_decode(text, i)
                return value
            except ValueError:
                continue
    return None


def normalize_text(text: str) -> str:
    """NFC-normalised, without zero-width characters, whitespace collapsed, trimmed."""
    text = unicodedata.normalize("NFC", text)
    text = "".join(ch for ch in text if unicodedata.category(ch) != "Cf")
    return " ".join(text.split())


def parse_final_answer(content: str | None) -> str | None:
    """The answer in a final reply: `{"answer": ...}` JSON (possibly fenced), or a
    `Final Answer: ...` line. None when the reply holds neither."""
    data = extract_json(content)
    if isinstance(data, dict) and "answer" in data:
        answer = data["answer"]
        if isinstance(answer, float) and answer.is_integer():
            answer = int(answer)
        if isinstance(answer, (list, tuple)):
            return ", ".join(normalize_text(str(a)) for a in answer)
        return normalize_text(str(answer))
    if content:
        match = _FINAL_ANSWER.search(content)
        if match:
            return normalize_text(match.group(1).strip().splitlines()[0])
    return None


def parse_arguments(raw: str | None) -> dict[str, Any]:
    """Tool-call arguments as a dict. Raises ValueError naming the problem."""
    if raw is None or not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"arguments are not valid JSON ({exc.msg} at character {exc.pos})") from exc
    if not isinstance(value, dict):
        raise ValueError(f"arguments must be a JSON object, got {type(value).__name__}")
    return value
