"""Each agent's conversation memory and the context built from it for a model call.

:class:`ChatHistoryMemory` stores records (a message and the API role it takes in this
agent's conversation). :class:`ContextCreator` turns them into the request's messages within
a token budget: first it compacts tool results older than the latest round (a one-line
digest keeps what was looked up), then it drops the lowest-scored older exchanges. The
system message and the newest exchange are never dropped, and a tool call is never
separated from its results.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from .messages import BackendRole, BaseMessage, to_openai_message
from .tokens import TokenCounter
from .tracing import current_span, traced


class ContextOverflowError(RuntimeError):
    """The context cannot be brought under the token limit."""


@dataclass
class MemoryRecord:
    message: BaseMessage
    role_at_backend: BackendRole
    turn: int
    round: int = 0


@dataclass
class ContextRecord:
    record: MemoryRecord
    score: float


class ChatHistoryMemory:
    """All records of one agent; with ``window_size``, only the newest that many are recalled."""

    def __init__(self, window_size: int | None = None, decay: float = 0.95) -> None:
        self.window_size = window_size
        self.decay = decay
        self._records: list[MemoryRecord] = []

    def write_record(self, record: MemoryRecord) -> None:
        self._records.append(record)

    def write_records(self, records: list[MemoryRecord]) -> None:
        self._records.extend(records)

    def __len__(self) -> int:
        return len(self._records)

    def retrieve(self) -> list[ContextRecord]:
        """System records first, then the (windowed) conversation scored by recency."""
        system = [r for r in self._records if r.role_at_backend is BackendRole.SYSTEM]
        rest = [r for r in self._records if r.role_at_backend is not BackendRole.SYSTEM]
        if self.window_size is not None and len(rest) > self.window_size:
            rest = rest[len(rest) - self.window_size :]
            # Never start the window on tool results whose call was cut off.
            while rest and rest[0].role_at_backend is BackendRole.TOOL:
                rest = rest[1:]
        newest = len(rest)
        scored = [ContextRecord(r, 1.0) for r in system]
        scored += [ContextRecord(r, self.decay ** (newest - i)) for i, r in enumerate(rest)]
        return scored


def _units(records: list[ContextRecord]) -> list[list[ContextRecord]]:
    """Group an assistant message with the tool results that answer it."""
    units: list[list[ContextRecord]] = []
    for item in records:
        if item.record.role_at_backend is BackendRole.TOOL and units:
            units[-1].append(item)
        else:
            units.append([item])
    return units


class ContextCreator:
    def __init__(self, counter: TokenCounter, token_limit: int, digest_chars: int = 160) -> None:
        self.counter = counter
        self.token_limit = token_limit
        self.digest_chars = digest_chars

    @staticmethod
    def to_messages(records: list[ContextRecord]) -> list[dict[str, Any]]:
        return [to_openai_message(item.record.message, item.record.role_at_backend) for item in records]

    @traced("context.create", "chain")
    def create_context(self, records: list[ContextRecord], tools: list[dict[str, Any]] | None) -> tuple[list[dict[str, Any]], int]:
        span = current_span()
        tokens = self.counter.count_prompt(self.to_messages(records), tools)
        if span is not None:
            span.update({"pathfinder.context.records": len(records), "pathfinder.context.tokens": tokens, "pathfinder.context.limit": self.token_limit})
        if tokens <= self.token_limit:
            return self.to_messages(records), tokens
        records = self.compact_tool_results(records)
        tokens = self.counter.count_prompt(self.to_messages(records), tools)
        dropped = 0
        units = _units(records)
        while tokens > self.token_limit:
            candidates = [i for i, unit in enumerate(units[:-1]) if unit[0].record.role_at_backend is not BackendRole.SYSTEM]
            if not candidates:
                raise ContextOverflowError(f"context needs {tokens} tokens, the limit is {self.token_limit}")
            lowest = min(candidates, key=lambda i: (units[i][0].score, i))
            dropped += len(units.pop(lowest))
            tokens = self.counter.count_prompt(self.to_messages([r for u in units for r in u]), tools)
        if span is not None:
            span.update({"pathfinder.context.tokens_after": tokens, "pathfinder.context.dropped_records": dropped,
                         "pathfinder.warning": "context over its limit: tool results compacted" + (", records dropped" if dropped else "")})
        return self.to_messages([r for u in units for r in u]), tokens

    @traced("context.summarize", "chain")
    def compact_tool_results(self, records: list[ContextRecord]) -> list[ContextRecord]:
        """Replace tool results older than the latest round by a short digest."""
        tool_positions = [i for i, item in enumerate(records) if item.record.role_at_backend is BackendRole.TOOL]
        if not tool_positions:
            return records
        latest = records[tool_positions[-1]].record
        out = []
        compacted = 0
        for item in records:
            record = item.record
            same_round = (record.turn, record.round) == (latest.turn, latest.round)
            if record.role_at_backend is BackendRole.TOOL and not same_round and len(record.message.content) > self.digest_chars:
                text = record.message.content
                digest = f"{text[: self.digest_chars].rstrip()} [... compacted: {len(text)} characters in the original result]"
                item = ContextRecord(replace(record, message=record.message.with_content(digest)), item.score)
                compacted += 1
            out.append(item)
        span = current_span()
        if span is not None:
            span.set("pathfinder.context.compacted_results", compacted)
        return out
