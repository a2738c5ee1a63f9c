"""JSON Lines spans in Pathfinder's trace format, located in the code that produced them.

Every span records `code.filepath` (relative to the agent root), `code.function` (the
qualified name, `Class.method`) and `code.lineno` (the first line of that function) of the
frame that opened it, so a reader of the trace alone can find the component at work.

Spans are written as they end, one line each, flushed at once, so a crash (or a kill) still
leaves everything finished so far. Spans opened for work done in threads are *deferred*: the
worker ends them and the opening thread emits them in opening order, so that two runs with the
same seed write the same lines in the same order; only ids and timestamps differ.
"""

from __future__ import annotations

import contextvars
import json
import secrets
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

AGENT_ROOT = Path(__file__).resolve().parent.parent
AGENT_NAME = "toolcaller"
MAX_VALUE_CHARS = 64 * 1024

_current: contextvars.ContextVar["Span | None"] = contextvars.ContextVar(
    "toolcaller_span", default=None
)


def clip(text: str, limit: int = MAX_VALUE_CHARS) -> str:
    """`text` cut to `limit` characters with a visible marker."""
    if len(text) <= limit:
        return text
    return text[: limit - 40] + f"... [clipped {len(text) - limit + 40} chars]"


def _attribute(value: Any) -> Any:
    """Attribute values are JSON strings, numbers or booleans; anything else becomes JSON."""
    if isinstance(value, (bool, int, float, str)):
        return value
    if value is None:
        return ""
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def _relative(filename: str) -> str:
    try:
        return Path(filename).resolve().relative_to(AGENT_ROOT).as_posix()
    except ValueError:
        return Path(filename).name


class Span:
    """One unit of work. Use as a context manager; exceptions mark it ERROR and propagate."""

    def __init__(self, tracer: "Tracer", name: str, kind: str, code, parent: "Span | None",
                 attributes: dict[str, Any], deferred: bool) -> None:
        self.tracer = tracer
        self.name = name
        self.kind = kind
        self.parent = parent
        self.deferred = deferred
        self.span_id = secrets.token_hex(8)
        self.start_ns = 0
        self.end_ns = 0
        self.status = "UNSET"
        self.status_message = ""
        self.attributes: dict[str, Any] = {
            "code.filepath": _relative(code.co_filename),
            "code.function": code.co_qualname,
            "code.lineno": code.co_firstlineno,
            "gen_ai.agent.name": AGENT_NAME,
            "pathfinder.step_index": tracer.step_index,
        }
        for key, value in attributes.items():
            self.set(key, value)
        self._token = None

    def set(self, key: str, value: Any) -> None:
        self.attributes[key] = _attribute(value)

    def ok(self) -> None:
        self.status = "OK"

    def error(self, exc: BaseException | None = None, message: str = "") -> None:
        """Marks the span failed; with an exception, records its type, message and stack."""
        self.status = "ERROR"
        self.status_message = message or (str(exc) if exc else "")
        if exc is not None:
            self.set("error.type", type(exc).__name__)
            self.set("exception.message", str(exc))
            self.set("exception.stacktrace",
                     clip("".join(traceback.format_exception(exc)), 16 * 1024))

    def __enter__(self) -> "Span":
        self.start_ns = time.time_ns()
        self._token = _current.set(self)
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.end_ns = time.time_ns()
        if exc is not None and self.status != "ERROR":
            self.error(exc)
        elif self.status == "UNSET":
            self.status = "OK"
        if self._token is not None:
            _current.reset(self._token)
            self._token = None
        if not self.deferred:
            self.tracer.emit(self)
        return False

    def to_json(self) -> dict[str, Any]:
        return {
            "trace_id": self.tracer.trace_id,
            "span_id": self.span_id,
            "parent_span_id": self.parent.span_id if self.parent else None,
            "name": self.name,
            "kind": self.kind,
            "start_time_unix_nano": self.start_ns,
            "end_time_unix_nano": self.end_ns,
            "status": {"code": self.status, "message": self.status_message},
            "attributes": self.attributes,
        }


class Tracer:
    """Writes spans to a JSON Lines file."""

    def __init__(self, path: str | Path | None) -> None:
        self.trace_id = secrets.token_hex(16)
        self.step_index = 0
        self._lock = threading.Lock()
        self._file = open(path, "w", encoding="utf-8") if path else None

    def span(self, name: str, kind: str = "other", attributes: dict[str, Any] | None = None,
             parent: Span | None = None, deferred: bool = False, code: Any = None) -> Span:
        """A span with the current span as parent, located at `code` (a function or method
        whose work the span records) or else at the calling function."""
        if code is None:
            code_obj = sys._getframe(1).f_code
        else:
            code_obj = getattr(getattr(code, "__func__", code), "__code__")
        return Span(self, name, kind, code_obj, parent if parent is not None else _current.get(),
                    attributes or {}, deferred)

    def emit(self, span: Span) -> None:
        if self._file is None:
            return
        line = json.dumps(span.to_json(), ensure_ascii=False)
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


def current_span() -> Span | None:
    return _current.get()
