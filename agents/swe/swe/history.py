"""Conversation history, its compression, and fitting it into the context window.

Every model reply is kept as its own assistant turn, so the number of assistant messages in
a request always equals the number of model calls made before it; compression only ever
shortens the *content* of old turns. Observations older than the last few are collapsed to
a one-line note (SWE-agent's "last N observations" processor). When the prompt still does
not fit, the window manager collapses more aggressively, clips long turns and, as a last
resort, drops the oldest exchanges after the system and issue messages.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

from .tokens import TokenCounter
from .tracing import Tracer

OBSERVATION_KINDS = ("observation", "format_error", "review")


@dataclass
class Turn:
    role: str  # system | user | assistant | tool
    content: str
    kind: str  # system | instance | action | observation | format_error | review
    step: int = 0
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


@dataclass
class History:
    turns: list[Turn] = field(default_factory=list)

    def append(self, turn: Turn) -> None:
        self.turns.append(turn)

    def assistant_turns(self) -> int:
        return sum(1 for t in self.turns if t.role == "assistant")


class ContextWindowExceeded(Exception):
    """The prompt cannot be made to fit even after every reduction."""


class ObservationCompressor:
    """Collapse all but the last ``keep_last`` observations to a single line."""

    def __init__(self, keep_last: int) -> None:
        self.keep_last = keep_last

    def compress(self, turns: list[Turn], keep_last: int | None = None) -> tuple[list[Turn], int]:
        keep_last = self.keep_last if keep_last is None else keep_last
        positions = [i for i, t in enumerate(turns) if t.kind in OBSERVATION_KINDS]
        keep = set(positions[-keep_last:]) if keep_last > 0 else set()
        # The latest observation answers the action the model is about to build on; hiding
        # it makes the model repeat that action, so it survives every compression level.
        if positions:
            keep.add(positions[-1])
        out, collapsed = [], 0
        for i, turn in enumerate(turns):
            if i in positions and i not in keep:
                lines = turn.content.count("\n") + 1
                out.append(replace(turn, content=f"Old environment output: ({lines} lines omitted)"))
                collapsed += 1
            else:
                out.append(turn)
        return out, collapsed


def clip_middle(text: str, max_chars: int) -> str:
    if len(text) <= max_chars:
        return text
    head = max_chars * 2 // 3
    tail = max_chars - head
    omitted = len(text) - head - tail
    return f"{text[:head]}\n[... {omitted} characters omitted ...]\n{text[-tail:]}"


def to_messages(turns: list[Turn]) -> list[dict[str, Any]]:
    """Turns in the chat-completions message format (tool results as ``tool`` messages)."""
    messages: list[dict[str, Any]] = []
    for turn in turns:
        message: dict[str, Any] = {"role": turn.role, "content": turn.content}
        if turn.role == "assistant" and turn.tool_calls:
            message["tool_calls"] = [
                {
                    "id": call["id"],
                    "type": "function",
                    "function": {"name": call["name"], "arguments": call["arguments"]},
                }
                for call in turn.tool_calls
            ]
            if not turn.content:
                message["content"] = None
        if turn.role == "tool":
            message["tool_call_id"] = turn.tool_call_id
        messages.append(message)
    return messages


class ContextWindow:
    """Fits the processed history under ``limit - max_tokens - margin`` tokens."""

    def __init__(
        self,
        counter: TokenCounter,
        compressor: ObservationCompressor,
        context_window: int,
        completion_tokens: int,
        margin: int,
        tracer: Tracer,
    ) -> None:
        self.counter = counter
        self.compressor = compressor
        self.budget = context_window - completion_tokens - margin
        self.tracer = tracer

    def fit(self, history: History, tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
        turns, collapsed = self.compressor.compress(history.turns)
        tokens = self.counter.count_request(to_messages(turns), tools)
        with self.tracer.span(
            "context.compress",
            "chain",
            {
                "pathfinder.context.turns": len(history.turns),
                "pathfinder.context.collapsed_observations": collapsed,
                "pathfinder.context.tokens": tokens,
                "pathfinder.context.budget": self.budget,
            },
        ):
            pass
        if tokens <= self.budget:
            return to_messages(turns)
        return to_messages(self._reduce(history.turns, tools, tokens))

    def _reduce(self, original: list[Turn], tools: list[dict[str, Any]] | None, tokens: int) -> list[Turn]:
        with self.tracer.span(
            "context.truncate",
            "chain",
            {"pathfinder.context.tokens_before": tokens, "pathfinder.context.budget": self.budget},
        ) as span:
            stages: list[str] = []
            turns = original
            for keep in range(self.compressor.keep_last - 1, -1, -1):
                turns, _ = self.compressor.compress(original, keep_last=keep)
                tokens = self._count(turns, tools)
                stages.append(f"keep_last={keep}")
                if tokens <= self.budget:
                    break
            if tokens > self.budget:
                turns = self._clip_long_turns(turns)
                tokens = self._count(turns, tools)
                stages.append("clip")
            while tokens > self.budget and self._drop_oldest_exchange(turns):
                tokens = self._count(turns, tools)
                stages.append("drop")
            span.set_attributes(
                {
                    "pathfinder.context.tokens_after": tokens,
                    "pathfinder.context.stages": json.dumps(stages),
                    "pathfinder.context.dropped_turns": len(original) - len(turns),
                }
            )
            if tokens > self.budget:
                raise ContextWindowExceeded(
                    f"prompt needs {tokens} tokens after every reduction; the budget is {self.budget}"
                )
            span.set_attribute("pathfinder.warning", "context window pressure: history was reduced")
            return turns

    def _count(self, turns: list[Turn], tools: list[dict[str, Any]] | None) -> int:
        return self.counter.count_request(to_messages(turns), tools)

    @staticmethod
    def _clip_long_turns(turns: list[Turn]) -> list[Turn]:
        last = len(turns) - 1
        return [
            t if t.kind in ("system", "instance") or i == last else replace(t, content=clip_middle(t.content, 1200))
            for i, t in enumerate(turns)
        ]

    @staticmethod
    def _drop_oldest_exchange(turns: list[Turn]) -> bool:
        """Remove the oldest action with its observations, never the system or issue turns."""
        protected = 0
        while protected < len(turns) and turns[protected].kind in ("system", "instance"):
            protected += 1
        # Keep the newest exchange: it is what the next reply continues from.
        actions = [i for i in range(protected, len(turns)) if turns[i].kind == "action"]
        if len(actions) < 2:
            return False
        start, end = actions[0], actions[1]
        del turns[start:end]
        return True
