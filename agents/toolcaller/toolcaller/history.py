"""The conversation: what the model has seen and what is carried from step to step."""

from __future__ import annotations

import copy
from typing import Any

from .llm import ChatResult
from .tools.base import ToolOutcome


class Conversation:
    def __init__(self, system: str, task: str) -> None:
        self.messages: list[dict[str, Any]] = [
            {"role": "system", "content": system},
            {"role": "user", "content": task},
        ]

    def add_reply(self, reply: ChatResult) -> None:
        self.messages.append(reply.as_message())

    def add_tool_results(self, outcomes: list[ToolOutcome]) -> None:
        for outcome in outcomes:
            self.messages.append({"role": "tool", "tool_call_id": outcome.call.id,
                                  "name": outcome.call.name, "content": outcome.output})

    def add_user(self, text: str) -> None:
        self.messages.append({"role": "user", "content": text})

    def replace(self, messages: list[dict[str, Any]]) -> None:
        """Adopts a fitted (summarised or shortened) history."""
        self.messages = messages

    def snapshot(self) -> list[dict[str, Any]]:
        return copy.deepcopy(self.messages)

    def last_tool_signature(self, back: int = 1) -> tuple | None:
        """The (name, arguments) of the tool calls of the `back`-th latest assistant turn."""
        turns = [m for m in self.messages if m["role"] == "assistant"]
        if len(turns) < back:
            return None
        calls = turns[-back].get("tool_calls") or []
        return tuple((c["function"]["name"], c["function"]["arguments"]) for c in calls) or None


def summarize_text(text: str, chars: int) -> str:
    """Keeps the head and tail of a long tool result, saying what was elided."""
    if len(text) <= chars:
        return text
    head = text[: chars * 2 // 3]
    tail = text[-(chars // 3):]
    return f"{head}\n[... {len(text) - len(head) - len(tail)} characters elided to save context ...]\n{tail}"
