"""Keeping a conversation within the model's context window, as a Pydantic AI history processor.

Pydantic AI runs a `ProcessHistory` capability's function on the message history before every
model request. `fit_history` keeps every message and part (the scripted model, like a real one,
reads its step from the turns it has taken) and, while the prompt would not fit, replaces the
oldest tool results: first with their head and tail, then with a one-line note. The newest
request (what the model answers now) and the task stay whole. Tokens are counted the way the
contract's server counts them (agents/CONTRACT.md): no tokeniser is downloaded or loaded.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from typing import Any

from pydantic_ai.messages import ModelMessage, ModelRequest, ToolReturnPart

WINDOW = 8192
# What the request adds beside the history: the instructions and the four tools' schemas.
RESERVE = 1400
CLIP_CHARS = 600
ELIDED = "[result elided to save context]"
_WORD = re.compile(r"\w+")


def count_text(text: str) -> int:
    """ceil(len/4) per run of word characters, 1 per other non-space character."""
    tokens = 0
    for piece in re.findall(r"\w+|\S", text):
        tokens += math.ceil(len(piece) / 4) if _WORD.fullmatch(piece) else 1
    return tokens


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def count_message(message: ModelMessage) -> int:
    """Tokens of a message's parts as they go over the wire (one chat message per part, about)."""
    tokens = 0
    for part in message.parts:
        tokens += 4
        for field in ("content", "args", "tool_name", "tool_call_id"):
            value = getattr(part, field, None)
            if value:
                tokens += count_text(_text(value))
    return tokens


def head_and_tail(text: str, chars: int) -> str:
    """The head and tail of a long tool result, saying how much was left out."""
    if len(text) <= chars:
        return text
    head, tail = text[: chars * 2 // 3], text[-(chars // 3):]
    return f"{head}\n[... {len(text) - len(head) - len(tail)} characters elided to save context ...]\n{tail}"


def fit_history(messages: list[ModelMessage], completion_tokens: int = 1024,
                window: int = WINDOW) -> list[ModelMessage]:
    """The history with the oldest tool results shortened until the prompt fits the window."""
    budget = window - completion_tokens - RESERVE
    out = list(messages)
    total = sum(count_message(m) for m in out)
    if total <= budget:
        return out
    older = [i for i, m in enumerate(out[1:-1], 1)
             if isinstance(m, ModelRequest) and any(isinstance(p, ToolReturnPart) for p in m.parts)]
    for shorten in (lambda text: head_and_tail(text, CLIP_CHARS), lambda text: ELIDED):
        for i in older:
            if total <= budget:
                return out
            before = count_message(out[i])
            parts = [dataclasses.replace(p, content=shorten(_text(p.content)))
                     if isinstance(p, ToolReturnPart) else p for p in out[i].parts]
            out[i] = dataclasses.replace(out[i], parts=parts)
            total -= before - count_message(out[i])
    return out
