"""Token counting that reproduces the API's approximate tokenizer, and the run's usage ledger.

The rule (the scripted server's, see crates/llmserve/src/tokenizer.rs): a maximal run of word
characters (letters, digits, `_`) costs ceil(len/4) tokens, every other non-space character
one token, whitespace nothing. A prompt costs 3 tokens per message plus its role, content,
name, tool-call names and arguments and tool_call_id, 3 tokens priming the reply, and the
compact JSON of the tools. Counting the same way as the API is what lets the context manager
trim *before* the API rejects a prompt.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from typing import Any

TOKENS_PER_MESSAGE = 3
REPLY_PRIMING = 3
_PIECE = re.compile(r"\w+|[^\w\s]")


def count_text(text: str | None) -> int:
    if not text:
        return 0
    total = 0
    for piece in _PIECE.findall(text):
        if piece[0].isalnum() or piece[0] == "_":
            total += (len(piece) + 3) // 4
        else:
            total += 1
    return total


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def count_message(message: dict[str, Any]) -> int:
    total = TOKENS_PER_MESSAGE + count_text(message.get("role"))
    total += count_text(_content_text(message.get("content")))
    total += count_text(message.get("name")) + count_text(message.get("tool_call_id"))
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        total += count_text(function.get("name")) + count_text(function.get("arguments"))
    return total


def count_tools(tools: list[dict[str, Any]] | None) -> int:
    if not tools:
        return 0
    return count_text(json.dumps(tools, separators=(",", ":"), ensure_ascii=False))


def count_prompt(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> int:
    return REPLY_PRIMING + sum(count_message(m) for m in messages) + count_tools(tools)


@dataclass
class UsageLedger:
    """Running token usage of the whole run, shared by concurrent researchers (thread-safe)."""

    input_tokens: int = 0
    output_tokens: int = 0
    calls: int = 0
    by_conversation: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(self, conversation: str, input_tokens: int, output_tokens: int) -> None:
        with self._lock:
            self.input_tokens += input_tokens
            self.output_tokens += output_tokens
            self.calls += 1
            self.by_conversation[conversation] = (
                self.by_conversation.get(conversation, 0) + input_tokens + output_tokens
            )

    @property
    def total(self) -> int:
        with self._lock:
            return self.input_tokens + self.output_tokens
