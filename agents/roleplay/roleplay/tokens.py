"""Token counting for context budgeting.

Approximates byte-pair encoding the way the Pathfinder endpoint bills it: every run of word
characters costs one token per started group of four characters, every other visible
character one token, whitespace nothing. A message adds 3 tokens of framing, a request 3
tokens of reply priming, and offered tools their compact JSON text.
"""

from __future__ import annotations

import json
from typing import Any

PER_MESSAGE = 3
PRIMING = 3


def _is_word(ch: str) -> bool:
    return ch.isalnum() or ch == "_"


class TokenCounter:
    def count(self, text: str | None) -> int:
        if not text:
            return 0
        tokens = 0
        run = 0
        for ch in text:
            if _is_word(ch):
                run += 1
                continue
            if run:
                tokens += (run + 3) // 4
                run = 0
            if not ch.isspace():
                tokens += 1
        if run:
            tokens += (run + 3) // 4
        return tokens

    def count_message(self, message: dict[str, Any]) -> int:
        tokens = PER_MESSAGE + self.count(message.get("role")) + self.count(message.get("content"))
        tokens += self.count(message.get("tool_call_id")) + self.count(message.get("name"))
        for call in message.get("tool_calls") or ():
            tokens += self.count(call["function"]["name"]) + self.count(call["function"]["arguments"])
        return tokens

    def count_prompt(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> int:
        tokens = PRIMING + sum(self.count_message(m) for m in messages)
        if tools:
            tokens += self.count(json.dumps(tools, ensure_ascii=False, separators=(",", ":")))
        return tokens
