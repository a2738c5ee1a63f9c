"""Tracing for the role-playing society: JSON Lines spans in Pathfinder's trace format.

Spans are opened with the :func:`traced` decorator (location = the decorated function) or
with :meth:`TraceRecorder.span` (location = the calling function). The current span, the
acting agent's name and the turn index live in context variables, so concurrently running
agent tasks each see their own. Spans are kept in memory and written in start order by
:meth:`TraceRecorder.flush`, atomically.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import itertools
import json
import linecache
import os
import secrets
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType
from typing import Any, Callable, Iterator

PACKAGE_ROOT = Path(__file__).resolve().parent.parent
VALUE_LIMIT = 64 * 1024

CURRENT_SPAN: contextvars.ContextVar["SpanRecord | None"] = contextvars.ContextVar("roleplay_span", default=None)
CURRENT_AGENT: contextvars.ContextVar[str] = contextvars.ContextVar("roleplay_agent", default="society")
CURRENT_TURN: contextvars.ContextVar[int] = contextvars.ContextVar("roleplay_turn", default=0)


def _relative(filename: str) -> str:
    try:
        return Path(filename).resolve().relative_to(PACKAGE_ROOT).as_posix()
    except ValueError:
        return os.path.basename(filename)


@functools.lru_cache(maxsize=512)
def _def_line(filename: str, first_line: int) -> int:
    """The ``def`` line of a function; ``co_firstlineno`` of a decorated one is its decorator."""
    for line in range(first_line, first_line + 60):
        text = linecache.getline(filename, line).lstrip()
        if text.startswith(("def ", "async def ")):
            return line
        if not text:
            break
    return first_line


def location_of(code: CodeType) -> dict[str, Any]:
    return {
        "code.filepath": _relative(code.co_filename),
        "code.function": code.co_qualname,
        "code.lineno": _def_line(code.co_filename, code.co_firstlineno),
    }


def clip(text: str, limit: int = VALUE_LIMIT) -> str:
    raw = text.encode("utf-8", errors="replace")
    return text if len(raw) <= limit else raw[:limit].decode("utf-8", errors="ignore")


def to_attribute(value: Any) -> Any:
    if isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        return clip(value)
    return clip(json.dumps(value, ensure_ascii=False, default=str))


@dataclass
class SpanRecord:
    name: str
    kind: str
    order: int
    parent_id: str | None
    span_id: str = field(default_factory=lambda: secrets.token_hex(8))
    start_ns: int = field(default_factory=time.time_ns)
    end_ns: int | None = None
    status: str = "UNSET"
    message: str = ""
    attributes: dict[str, Any] = field(default_factory=dict)

    def set(self, key: str, value: Any) -> None:
        if value is not None:
            self.attributes[key] = to_attribute(value)

    def update(self, values: dict[str, Any]) -> None:
        for key, value in values.items():
            self.set(key, value)

    def fail(self, exc: BaseException) -> None:
        self.status = "ERROR"
        self.message = f"{type(exc).__name__}: {exc}"
        self.set("error.type", type(exc).__name__)
        self.set("exception.message", str(exc))
        stack = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        self.set("exception.stacktrace", stack.replace(str(PACKAGE_ROOT) + os.sep, ""))

    def close(self) -> None:
        if self.end_ns is None:
            self.end_ns = time.time_ns()
        if self.status == "UNSET":
            self.status = "OK"


class TraceRecorder:
    """Holds one run's spans; there is exactly one per process (see :func:`recorder`)."""

    def __init__(self) -> None:
        self.path: Path | None = None
        self.trace_id = secrets.token_hex(16)
        self.spans: list[SpanRecord] = []
        self._order = itertools.count()
        self._lock = threading.Lock()

    def configure(self, path: Path | None) -> None:
        """Start a new trace written to ``path`` (spans recorded before are discarded)."""
        with self._lock:
            self.path = path
            self.trace_id = secrets.token_hex(16)
            self.spans = []

    def open(self, name: str, kind: str, code: CodeType, attributes: dict[str, Any] | None = None) -> SpanRecord:
        parent = CURRENT_SPAN.get()
        with self._lock:
            record = SpanRecord(name, kind, next(self._order), parent.span_id if parent else None)
            self.spans.append(record)
        record.attributes.update(location_of(code))
        record.set("gen_ai.agent.name", CURRENT_AGENT.get())
        record.set("pathfinder.step_index", CURRENT_TURN.get())
        if attributes:
            record.update(attributes)
        return record

    @contextlib.contextmanager
    def span(self, name: str, kind: str, attributes: dict[str, Any] | None = None, code: CodeType | None = None) -> Iterator[SpanRecord]:
        record = self.open(name, kind, code or sys._getframe(2).f_code, attributes)
        token = CURRENT_SPAN.set(record)
        try:
            yield record
        except BaseException as exc:
            record.fail(exc)
            raise
        finally:
            CURRENT_SPAN.reset(token)
            record.close()

    def flush(self) -> None:
        if self.path is None:
            return
        with self._lock:
            ordered = sorted(self.spans, key=lambda s: s.order)
            lines = []
            for s in ordered:
                lines.append(
                    json.dumps(
                        {
                            "trace_id": self.trace_id,
                            "span_id": s.span_id,
                            "parent_span_id": s.parent_id,
                            "name": s.name,
                            "kind": s.kind,
                            "start_time_unix_nano": s.start_ns,
                            "end_time_unix_nano": s.end_ns or time.time_ns(),
                            "status": {"code": s.status if s.end_ns else "ERROR", "message": s.message or ("" if s.end_ns else "span never ended")},
                            "attributes": s.attributes,
                        },
                        ensure_ascii=False,
                    )
                )
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(self.path.suffix + ".partial")
        tmp.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        os.replace(tmp, self.path)


_RECORDER = TraceRecorder()


def recorder() -> TraceRecorder:
    return _RECORDER


def traced(name: str, kind: str = "chain", attributes: Callable[..., dict[str, Any]] | None = None):
    """Record each call of the decorated (sync or async) function as a span located there.

    ``attributes``, when given, is called with the function's arguments and returns the
    span's initial attributes.
    """

    def decorate(func):
        code = func.__code__

        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_wrapper(*args, **kwargs):
                attrs = attributes(*args, **kwargs) if attributes else None
                with _RECORDER.span(name, kind, attrs, code=code):
                    return await func(*args, **kwargs)

            return async_wrapper

        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            attrs = attributes(*args, **kwargs) if attributes else None
            with _RECORDER.span(name, kind, attrs, code=code):
                return func(*args, **kwargs)

        return wrapper

    return decorate


def current_span() -> SpanRecord | None:
    return CURRENT_SPAN.get()


@contextlib.contextmanager
def acting_as(agent_name: str, turn: int | None = None) -> Iterator[None]:
    """Attribute spans opened inside the block to ``agent_name`` (and a turn index)."""
    agent_token = CURRENT_AGENT.set(agent_name)
    turn_token = CURRENT_TURN.set(turn) if turn is not None else None
    try:
        yield
    finally:
        CURRENT_AGENT.reset(agent_token)
        if turn_token is not None:
            CURRENT_TURN.reset(turn_token)
