"""Reading the model's final reply as an answer, and checking it against the task's."""

from __future__ import annotations

import json
import re

_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.S)


def parse_answer(reply: str) -> str:
    """The `answer` field of the JSON object in a reply, as text. The object may stand alone,
    sit in a fenced block, or end a sentence of prose; ValueError when there is none."""
    text = reply.strip()
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group(1)
    start = text.rfind('{"answer"')
    if start < 0:
        raise ValueError("the reply has no {\"answer\": ...} object")
    value, _ = json.JSONDecoder().raw_decode(text[start:])
    value = value["answer"]
    return value if isinstance(value, str) else json.dumps(value)


def same_answer(got: str, want: str) -> bool:
    """Numbers compared as numbers, text without case or surrounding space."""
    try:
        return abs(float(got) - float(want)) <= 1e-6 * max(1.0, abs(float(want)))
    except ValueError:
        return got.strip().lower() == want.strip().lower()
