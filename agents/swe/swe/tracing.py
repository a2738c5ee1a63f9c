"""Span recording in the Pathfinder trace format (JSON Lines, OpenTelemetry GenAI names).

Every span carries the source location of the component that produced it
(``code.filepath`` relative to the agent root, ``code.function`` as ``Class.method``,
``code.lineno`` of that function's definition), so a trace alone localises behaviour.

Spans are buffered and written once, in start order, when the tracer is flushed; the
entry point flushes in a ``finally`` block, on SIGTERM and at interpreter exit, so a
crashing run still leaves its trace with the root span marked ERROR.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import secrets
import sys
import threading
import time
import traceback
from pathlib import Path
from types import CodeType
from typing import Any, Iterator

AGENT_ROOT = Path(__file__).resolve().parent.parent
MAX_VALUE_BYTES = 64 * 1024

_current_span: contextvars.ContextVar["Span | None"] = contextvars.ContextVar(
    "swe_current_span", default=None
)
_step_index: contextvars.ContextVar[int] = contextvars.ContextVar("swe_step_index", default=0)


def relative_source_path(filename: str) -> str:
    """Path of a source file relative to the agent root (absolute paths leak the checkout)."""
    try:
        return Path(filename).resolve().relative_to(AGENT_ROOT).as_posix()
    except ValueError:
        return Path(filename).name


def code_attributes(code: CodeType) -> dict[str, Any]:
    return {
        "code.filepath": relative_source_path(code.co_filename),
        "code.function": code.co_qualname,
        "code.lineno": code.co_firstlineno,
    }


def clip_text(text: str, limit: int = MAX_VALUE_BYTES) -> str:
    """Clip to ``limit`` UTF-8 bytes without splitting a character."""
    data = text.encode("utf-8", errors="replace")
    if len(data) <= limit:
        return text
    return data[:limit].decode("utf-8", errors="ignore")


def relative_stacktrace(exc: BaseException) -> str:
    """Formatted traceback with the agent root and work directories stripped from paths."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return text.replace(str(AGENT_ROOT) + os.sep, "")


def _attribute_value(value: Any) -> Any:
    if isinstance(value, bool) or isinstance(value, (int, float)):
        return value
    if isinstance(value, str):
        return clip_text(value)
    return clip_text(json.dumps(value, ensure_ascii=False, sort_keys=True, default=str))


class Span:
    """One unit of work; ended exactly once."""

    def __init__(
        self,
        tracer: "Tracer",
        name: str,
        kind: str,
        parent: "Span | None",
        code: CodeType,
        sequence: int,
    ) -> None:
        self.tracer = tracer
        self.name = name
        self.kind = kind
        self.span_id = secrets.token_hex(8)
        self.parent_span_id = parent.span_id if parent else None
        self.sequence = sequence
        self.start_ns = time.time_ns()
        self.end_ns: int | None = None
        self.status_code = "UNSET"
        self.status_message = ""
        self.attributes: dict[str, Any] = {}
        self.attributes.update(code_attributes(code))

    def set_attribute(self, key: str, value: Any) -> None:
        if value is None:
            return
        self.attributes[key] = _attribute_value(value)

    def set_attributes(self, values: dict[str, Any]) -> None:
        for key, value in values.items():
            self.set_attribute(key, value)

    def set_location(self, code: CodeType) -> None:
        """Attribute the span to another function, e.g. the command handler that ran."""
        self.attributes.update(code_attributes(code))

    def set_status(self, code: str, message: str = "") -> None:
        self.status_code = code
        self.status_message = message

    def record_exception(self, exc: BaseException) -> None:
        self.set_status("ERROR", f"{type(exc).__name__}: {exc}")
        self.set_attribute("error.type", type(exc).__name__)
        self.set_attribute("exception.message", str(exc))
        self.set_attribute("exception.stacktrace", relative_stacktrace(exc))

    def end(self) -> None:
        if self.end_ns is None:
            self.end_ns = time.time_ns()

    def to_json(self) -> dict[str, Any]:
        return {
            "trace_id": self.tracer.trace_id,
            "span_id": self.span_id,
            "parent_span_id": self.parent_span_id,
            "name": self.name,
            "kind": self.kind,
            "start_time_unix_nano": self.start_ns,
            "end_time_unix_nano": self.end_ns if self.end_ns is not None else time.time_ns(),
            "status": {"code": self.status_code, "message": self.status_message},
            "attributes": self.attributes,
        }


class Tracer:
    """Collects the spans of one run and writes them to a JSONL file."""

    def __init__(self, path: Path | None, agent_name: str) -> None:
        self.path = path
        self.agent_name = agent_name
        self.trace_id = secrets.token_hex(16)
        self._spans: list[Span] = []
        self._lock = threading.Lock()
        self._sequence = 0
        self._flushed = False

    @staticmethod
    def set_step(index: int) -> None:
        _step_index.set(index)

    @staticmethod
    def current_step() -> int:
        return _step_index.get()

    def start_span(
        self,
        name: str,
        kind: str,
        attributes: dict[str, Any] | None = None,
        code: CodeType | None = None,
        depth: int = 1,
    ) -> Span:
        if code is None:
            code = sys._getframe(depth).f_code
        with self._lock:
            self._sequence += 1
            span = Span(self, name, kind, _current_span.get(), code, self._sequence)
            self._spans.append(span)
        span.set_attribute("gen_ai.agent.name", self.agent_name)
        span.set_attribute("pathfinder.step_index", _step_index.get())
        if attributes:
            span.set_attributes(attributes)
        return span

    @contextlib.contextmanager
    def span(
        self,
        name: str,
        kind: str,
        attributes: dict[str, Any] | None = None,
        code: CodeType | None = None,
    ) -> Iterator[Span]:
        """Open a span as the current one; exceptions mark it ERROR and propagate."""
        if code is None:
            # Frame 0 is this generator, 1 is contextlib's __enter__, 2 the caller.
            code = sys._getframe(2).f_code
        span = self.start_span(name, kind, attributes, code=code)
        token = _current_span.set(span)
        try:
            yield span
        except BaseException as exc:
            span.record_exception(exc)
            raise
        else:
            if span.status_code == "UNSET":
                span.set_status("OK")
        finally:
            _current_span.reset(token)
            span.end()

    @contextlib.contextmanager
    def activate(self, span: Span) -> Iterator[Span]:
        """Make an already started span the parent of spans opened inside the block."""
        token = _current_span.set(span)
        try:
            yield span
        finally:
            _current_span.reset(token)

    def flush(self) -> None:
        """Write every span (open ones are closed as they stand), atomically."""
        if self.path is None:
            return
        with self._lock:
            spans = sorted(self._spans, key=lambda s: s.sequence)
            lines = [json.dumps(s.to_json(), ensure_ascii=False) for s in spans]
            self._flushed = True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            for line in lines:
                fh.write(line + "\n")
        os.replace(tmp, self.path)
