"""Token counting and the context window.

The count follows the approximate tokenizer of `agents/CONTRACT.md` (the one the scripted
server uses): a run of word characters costs ceil(len / 4) tokens, any other non-space
character one token, whitespace nothing; each message costs 3 more, the prompt 3 more, and
offered tools the count of their compact JSON.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

_PIECE = re.compile(r"(\w+)|[^\w\s]")
TOKENS_PER_MESSAGE = 3
REPLY_PRIMING = 3


def count_tokens(text: str | None) -> int:
    if not text:
        return 0
    total = 0
    for match in _PIECE.finditer(text):
        word = match.group(1)
        total += (len(word) + 3) // 4 if word else 1
    return total


def count_message(message: dict[str, Any]) -> int:
    total = TOKENS_PER_MESSAGE + count_tokens(message.get("role", ""))
    content = message.get("content")
    if isinstance(content, str):
        total += count_tokens(content)
    elif isinstance(content, list):
        total += sum(count_tokens(p.get("text", "")) for p in content if isinstance(p, dict))
    if message.get("name"):
        total += count_tokens(message["name"])
    if message.get("tool_call_id"):
        total += count_tokens(message["tool_call_id"])
    for call in message.get("tool_calls") or []:
        function = call.get("function", {})
        total += count_tokens(function.get("name", ""))
        total += count_tokens(function.get("arguments", ""))
    return total


def count_prompt(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> int:
    total = REPLY_PRIMING + sum(count_message(m) for m in messages)
    if tools:
        total += count_tokens(json.dumps(tools, ensure_ascii=False, separators=(",", ":")))
    return total


@dataclass
class UsageMeter:
    """Running token usage of a run, as this agent counts it."""

    input_tokens: int = 0
    output_tokens: int = 0
    calls: int = 0
    history: list[tuple[int, int]] = field(default_factory=list)

    def record(self, input_tokens: int, output_tokens: int) -> None:
        self.input_tokens += input_tokens
        self.output_tokens += output_tokens
        self.calls += 1
        self.history.append((input_tokens, output_tokens))

    @property
    def total(self) -> int:
        return self.input_tokens + self.output_tokens


class ContextOverflow(Exception):
    """The prompt cannot be made to fit the window."""


@dataclass
class ContextWindow:
    """Keeps a prompt within `limit` tokens, leaving `reserve` for the completion."""

    limit: int = 8192
    reserve: int = 1024
    # Tool results longer than this many characters are the first thing to be shortened.
    clip_chars: int = 600

    @property
    def budget(self) -> int:
        return self.limit - self.reserve

    def fits(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> bool:
        return count_prompt(messages, tools) <= self.budget

    def fit(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
            summarize) -> tuple[list[dict[str, Any]], dict[str, int]]:
        """A version of `messages` that fits, and what was done to get there.

        First the oldest long tool results are summarised (`summarize(text, chars)`), then
        the oldest tool results are elided and old assistant text shortened. Turns are never
        dropped: every assistant reply stays in the history (the scripted server reads the
        step from their number, and a real model needs the call/result pairing). The system
        prompt, the task and the latest exchange are kept as they are.
        """
        before = count_prompt(messages, tools)
        report = {"tokens_before": before, "summarized": 0, "elided": 0, "tokens_after": before}
        if before <= self.budget:
            return messages, report
        fitted = [dict(m) for m in messages]
        last_assistant = max((i for i, m in enumerate(fitted) if m.get("role") == "assistant"),
                             default=len(fitted))
        older = range(2, last_assistant)
        for i in older:
            if count_prompt(fitted, tools) <= self.budget:
                break
            m = fitted[i]
            if m.get("role") == "tool" and len(m.get("content") or "") > self.clip_chars:
                m["content"] = summarize(m["content"], self.clip_chars)
                report["summarized"] += 1
        for i in older:
            if count_prompt(fitted, tools) <= self.budget:
                break
            m = fitted[i]
            if m.get("role") == "tool" and m.get("content") != ELIDED:
                m["content"] = ELIDED
                report["elided"] += 1
            elif m.get("role") == "assistant" and len(m.get("content") or "") > 80:
                m["content"] = summarize(m["content"], 80)
                report["elided"] += 1
        report["tokens_after"] = count_prompt(fitted, tools)
        if report["tokens_after"] > self.budget:
            raise ContextOverflow(
                f"prompt needs {report['tokens_after']} tokens after eliding, budget {self.budget}")
        return fitted, report


ELIDED = "[result elided to save context]"

