"""Token counting and the run's running usage.

The counting rule is the one the Pathfinder endpoint bills by (and a fair approximation of
byte-pair encoders for English and code): a run of word characters (letters, digits and
``_``, any script) costs one token per four characters, rounded up; every other visible
character costs one token; whitespace is free. Each message costs a framing overhead plus
its role, content, tool-call names and arguments and ``tool_call_id``; the reply costs a
priming overhead; offered tools cost their compact JSON text.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

_PIECE = re.compile(r"[^\W]+|[^\w\s]", re.UNICODE)

MESSAGE_OVERHEAD = 3
REPLY_PRIMING = 3


class TokenCounter:
    def count_text(self, text: str) -> int:
        if not text:
            return 0
        total = 0
        for match in _PIECE.finditer(text):
            piece = match.group(0)
            if piece[0].isalnum() or piece[0] == "_":
                total += (len(piece) + 3) // 4
            else:
                total += 1
        return total

    def count_message(self, message: dict[str, Any]) -> int:
        total = MESSAGE_OVERHEAD + self.count_text(message.get("role", ""))
        content = message.get("content")
        if isinstance(content, str):
            total += self.count_text(content)
        elif isinstance(content, list):
            total += sum(self.count_text(part.get("text", "")) for part in content if isinstance(part, dict))
        if message.get("name"):
            total += self.count_text(message["name"])
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            total += self.count_text(function.get("name", "")) + self.count_text(function.get("arguments", ""))
        if message.get("tool_call_id"):
            total += self.count_text(message["tool_call_id"])
        return total

    def count_messages(self, messages: list[dict[str, Any]]) -> int:
        return sum(self.count_message(m) for m in messages) + REPLY_PRIMING

    def count_tools(self, tools: list[dict[str, Any]] | None) -> int:
        if not tools:
            return 0
        return self.count_text(json.dumps(tools, ensure_ascii=False, separators=(",", ":")))

    def count_request(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> int:
        return self.count_messages(messages) + self.count_tools(tools)


@dataclass
class UsageTracker:
    """Running token totals and their cost for the whole run."""

    input_cost_per_1k: float
    output_cost_per_1k: float
    input_tokens: int = 0
    output_tokens: int = 0
    calls: int = 0

    def add(self, prompt_tokens: int, completion_tokens: int) -> None:
        self.input_tokens += prompt_tokens
        self.output_tokens += completion_tokens
        self.calls += 1

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    @property
    def cost(self) -> float:
        return (
            self.input_tokens * self.input_cost_per_1k + self.output_tokens * self.output_cost_per_1k
        ) / 1000.0
