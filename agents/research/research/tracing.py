"""Spans in Pathfinder's JSON Lines trace format, with the code location of their producer.

A span's parent comes from a context variable, so it follows the work across asyncio tasks
(each task copies the context it was created in) and into worker threads started with
`asyncio.to_thread`. Every span also gets a deterministic *position*: its parent's position
plus the order in which the parent opened its children. Spans are written sorted by position,
which makes two runs with the same seed produce the same sequence of lines even when parallel
sub-researchers finish in a different order; only ids and timestamps differ.

`code.filepath` is relative to the agent root, `code.function` is the producing function's
qualified name (`Class.method`) and `code.lineno` its first line, so a trace alone points a
reader at the component that produced each span.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import sys
import threading
import time
import traceback
from pathlib import Path
from types import CodeType, FunctionType, MethodType
from typing import Any

AGENT_ROOT = Path(__file__).resolve().parent.parent
MAX_VALUE_BYTES = 64 * 1024

_current: contextvars.ContextVar["Span | None"] = contextvars.ContextVar(
    "research_current_span", default=None
)
_agent_name: contextvars.ContextVar[str] = contextvars.ContextVar(
    "research_agent_name", default="research"
)
_step_index: contextvars.ContextVar[int] = contextvars.ContextVar(
    "research_step_index", default=0
)


def set_agent(name: str) -> contextvars.Token[str]:
    """Names the (sub-)agent whose work the following spans record."""
    return _agent_name.set(name)


@contextlib.contextmanager
def agent_scope(name: str, step: int = 0):
    """Spans opened inside the block belong to (sub-)agent `name`, starting at `step`."""
    agent_token, step_token = _agent_name.set(name), _step_index.set(step)
    try:
        yield
    finally:
        _step_index.reset(step_token)
        _agent_name.reset(agent_token)


def current_agent() -> str:
    return _agent_name.get()


def set_step(index: int) -> contextvars.Token[int]:
    """The step of the current (sub-)agent that following spans belong to."""
    return _step_index.set(index)


def _source_path(filename: str) -> str:
    try:
        return Path(filename).resolve().relative_to(AGENT_ROOT).as_posix()
    except ValueError:
        return Path(filename).name


def _code_of(target: Any) -> CodeType:
    if isinstance(target, CodeType):
        return target
    if isinstance(target, MethodType):
        target = target.__func__
    if isinstance(target, FunctionType):
        return target.__code__
    func = getattr(target, "__func__", None) or getattr(target, "__call__", None)
    code = getattr(getattr(func, "__func__", func), "__code__", None)
    if code is None:
        raise TypeError(f"cannot find the code of {target!r}")
    return code


def code_location(target: Any) -> dict[str, Any]:
    code = _code_of(target)
    return {
        "code.filepath": _source_path(code.co_filename),
        "code.function": code.co_qualname,
        "code.lineno": code.co_firstlineno,
    }


def clip_value(text: str, limit: int = MAX_VALUE_BYTES) -> str:
    """At most `limit` UTF-8 bytes, cut on a character boundary."""
    data = text.encode("utf-8", errors="replace")
    if len(data) <= limit:
        return text
    return data[:limit].decode("utf-8", errors="ignore")


def attribute_value(value: Any) -> str | int | float | bool:
    """Attribute values are JSON strings, numbers or booleans; anything else becomes JSON text."""
    if isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        return clip_value(value)
    return clip_value(json.dumps(value, ensure_ascii=False, sort_keys=True, default=str))


def stacktrace(exc: BaseException) -> str:
    """The traceback with the agent root stripped, so it does not depend on the checkout path."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return text.replace(str(AGENT_ROOT) + os.sep, "")


class Span:
    """One unit of work. Use it as a context manager, or end it explicitly exactly once."""

    def __init__(
        self,
        tracer: "Tracer",
        name: str,
        kind: str,
        parent: "Span | None",
        position: tuple[int, ...],
        attributes: dict[str, Any],
    ):
        self.tracer = tracer
        self.name = name
        self.kind = kind
        self.parent = parent
        self.position = position
        self.span_id = tracer.new_id(8)
        self.start_ns = time.time_ns()
        self.end_ns: int | None = None
        self.status_code = "UNSET"
        self.status_message = ""
        self.attributes: dict[str, Any] = {}
        self._children = 0
        self._token: contextvars.Token | None = None
        self.set(attributes)

    def next_child_position(self) -> tuple[int, ...]:
        with self.tracer.lock:
            self._children += 1
            return self.position + (self._children,)

    def set(self, attributes: dict[str, Any]) -> "Span":
        for key, value in attributes.items():
            if value is not None:
                self.attributes[key] = attribute_value(value)
        return self

    def ok(self, message: str = "") -> None:
        self.status_code, self.status_message = "OK", message

    def error(self, message: str, error_type: str | None = None) -> None:
        self.status_code, self.status_message = "ERROR", message
        if error_type:
            self.attributes["error.type"] = error_type
        self.attributes["exception.message"] = clip_value(message)

    def record_exception(self, exc: BaseException) -> None:
        self.error(f"{type(exc).__name__}: {exc}", type(exc).__name__)
        self.attributes["exception.message"] = clip_value(str(exc))
        self.attributes["exception.stacktrace"] = clip_value(stacktrace(exc))

    def end(self) -> None:
        if self.end_ns is not None:
            return
        self.end_ns = time.time_ns()
        if self.status_code == "UNSET":
            self.status_code = "OK"
        self.tracer.finished(self)

    # Context-manager use: the span becomes the parent of spans opened inside the block.
    def __enter__(self) -> "Span":
        self._token = _current.set(self)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc is not None and self.status_code != "ERROR":
            self.record_exception(exc)
        if self._token is not None:
            _current.reset(self._token)
            self._token = None
        self.end()

    def to_json(self, trace_id: str) -> dict[str, Any]:
        return {
            "trace_id": trace_id,
            "span_id": self.span_id,
            "parent_span_id": self.parent.span_id if self.parent else None,
            "name": self.name,
            "kind": self.kind,
            "start_time_unix_nano": self.start_ns,
            "end_time_unix_nano": self.end_ns if self.end_ns is not None else time.time_ns(),
            "status": {"code": self.status_code, "message": self.status_message},
            "attributes": self.attributes,
        }


class Tracer:
    """Collects spans and writes them, sorted by position, to a JSONL file on `flush`.

    Writing happens once, at exit (normal, crash or SIGTERM): a trace is either complete or
    absent, never half a file.
    """

    def __init__(self, path: str | os.PathLike[str] | None, agent_name: str = "research"):
        self.path = Path(path) if path else None
        self.agent_name = agent_name
        self.trace_id = self.new_id(16)
        self.lock = threading.Lock()
        self._finished: list[Span] = []
        self._open: dict[str, Span] = {}
        self._roots = 0
        self._flushed = False

    @staticmethod
    def new_id(nbytes: int) -> str:
        return os.urandom(nbytes).hex()

    def span(
        self,
        name: str,
        kind: str = "chain",
        attributes: dict[str, Any] | None = None,
        code: Any = None,
        parent: "Span | None" = None,
    ) -> Span:
        """Opens a span located at `code` (a function) or else at the calling function."""
        location = code_location(code if code is not None else sys._getframe(1).f_code)
        parent = parent if parent is not None else _current.get()
        if parent is None:
            with self.lock:
                self._roots += 1
                position: tuple[int, ...] = (self._roots,)
        else:
            position = parent.next_child_position()
        attrs = dict(location)
        attrs["gen_ai.agent.name"] = _agent_name.get()
        attrs["pathfinder.step_index"] = _step_index.get()
        attrs.update(attributes or {})
        span = Span(self, name, kind, parent, position, attrs)
        with self.lock:
            self._open[span.span_id] = span
        return span

    def finished(self, span: Span) -> None:
        with self.lock:
            self._open.pop(span.span_id, None)
            self._finished.append(span)

    def flush(self) -> None:
        """Ends spans still open (marking them ERROR) and writes every span once."""
        with self.lock:
            if self._flushed:
                return
            self._flushed = True
            dangling = list(self._open.values())
        for span in dangling:
            span.error("span still open when the trace was flushed", "SpanNotEnded")
            span.end()
        if self.path is None:
            return
        with self.lock:
            spans = sorted(self._finished, key=lambda s: s.position)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as out:
            for span in spans:
                out.write(json.dumps(span.to_json(self.trace_id), ensure_ascii=False))
                out.write("\n")
        os.replace(tmp, self.path)


def current_span() -> Span | None:
    return _current.get()
