"""Server-sent events and the assembly of streamed chat-completion chunks into one message.

Chunks arrive with arbitrary boundaries: content in pieces, a tool call's name in one chunk and
its arguments spread over many, usage in a final chunk with no choices. The assembler keys
tool-call deltas by their `index`, so interleaved and split arguments come together intact.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator


class StreamError(ValueError):
    """The stream ended without a finish reason or [DONE] (an incomplete response)."""


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str

    def to_message(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class Completion:
    content: str | None
    tool_calls: list[ToolCall]
    finish_reason: str | None
    usage: dict[str, Any] | None
    chunks: int = 0
    malformed_chunks: int = 0
    done: bool = False


def sse_events(lines: Iterable[bytes]) -> Iterator[str]:
    """The `data` payloads of an SSE byte stream (multi-line data joined with newlines)."""
    data: list[str] = []
    for raw in lines:
        line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
        if not line:
            if data:
                yield "\n".join(data)
                data = []
            continue
        if line.startswith(":"):
            continue  # comment / keep-alive
        field_name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if field_name == "data":
            data.append(value)
    if data:
        yield "\n".join(data)


@dataclass
class _PartialCall:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class StreamAssembler:
    """Feeds on decoded chunks; `finish()` yields the assembled completion."""

    def __init__(self) -> None:
        self._content: list[str] = []
        self._calls: dict[int, _PartialCall] = {}
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.chunks = 0
        self.malformed = 0
        self.done = False

    def feed_data(self, payload: str) -> None:
        """One SSE data payload: `[DONE]` or a JSON chunk. Unparseable chunks are counted."""
        if payload.strip() == "[DONE]":
            self.done = True
            return
        try:
            chunk = json.loads(payload)
        except json.JSONDecodeError:
            self.malformed += 1
            return
        if not isinstance(chunk, dict):
            self.malformed += 1
            return
        if "error" in chunk:
            error = chunk["error"]
            if not isinstance(error, dict):
                error = {"message": error}
            raise StreamError(f"error event in stream: {error.get('message', error)}")
        self.feed(chunk)

    def feed(self, chunk: dict[str, Any]) -> None:
        self.chunks += 1
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            text = delta.get("content")
            if isinstance(text, str):
                self._content.append(text)
            for call in delta.get("tool_calls") or []:
                slot = self._calls.setdefault(int(call.get("index", 0)), _PartialCall())
                if call.get("id"):
                    slot.id = call["id"]
                function = call.get("function") or {}
                if function.get("name"):
                    slot.name += function["name"]
                if isinstance(function.get("arguments"), str):
                    slot.arguments.append(function["arguments"])
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]

    def finish(self) -> Completion:
        if self.finish_reason is None and not self.done:
            raise StreamError(
                f"stream ended after {self.chunks} chunk(s) without a finish reason or [DONE]"
            )
        calls = [
            ToolCall(slot.id or f"call_{i}", slot.name, "".join(slot.arguments))
            for i, slot in sorted(self._calls.items())
        ]
        content = "".join(self._content) if self._content else None
        return Completion(content, calls, self.finish_reason, self.usage,
                          self.chunks, self.malformed, self.done)
