"""Pydantic AI's OpenTelemetry spans, written as Pathfinder's JSON Lines trace contract.

Pydantic AI instruments itself (`Agent.instrument_all`, GenAI semantic conventions): the agent
run, each model request and each tool call open a span. This module is the span processor
those spans go through. It adds what the contract needs and Pydantic AI does not give: the
code location of each span (from the stack when the span starts: the innermost frame of the
agent's own code that is not tracing machinery), the agent name inherited from the nearest
ancestor that has one, the step index (model requests finished so far), and the contract's
`kind`, `input.value` and `output.value`. Each span is written as one line when it ends and
flushed at once, so a crash still leaves everything that finished.
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.trace import StatusCode

AGENT_ROOT = Path(__file__).resolve().parent.parent
MAX_VALUE_CHARS = 64 * 1024

# Frames in these files open spans on someone else's behalf; the span belongs to their caller.
_MACHINERY = (
    str(AGENT_ROOT / "pydantic_ai" / "models" / "instrumented.py"),
    str(AGENT_ROOT / "pydantic_ai" / "_instrumentation.py"),
    str(AGENT_ROOT / "pydantic_ai" / "capabilities" / "instrumentation.py"),
    str(AGENT_ROOT / "pydantic_ai" / "capabilities" / "combined.py"),
    str(AGENT_ROOT / "pydantic_ai" / "capabilities" / "abstract.py"),
    str(AGENT_ROOT / "pydantic_ai" / "_utils.py"),
    str(AGENT_ROOT / "pydantic_ai" / "_durable_replay.py"),
    str(Path(__file__).resolve()),
)

# Helpers that wrap the real work in hooks or retry scopes; the span belongs to the function
# that called them.
_WRAPPERS = frozenset({"_outside_attempts", "_run_execute_hooks", "_run_validate_hooks", "lifecycle",
                       "do_execute", "do_validate", "wrapped", "start_as_current_span"})

# Pydantic AI's `gen_ai.operation.name` -> the contract's kind.
_KINDS = {
    "invoke_agent": "agent",
    "chat": "llm",
    "execute_tool": "tool",
    "running_tools": "chain",
}


def clip(text: str, limit: int = MAX_VALUE_CHARS) -> str:
    if len(text) <= limit:
        return text
    return text[: limit - 40] + f"... [clipped {len(text) - limit + 40} chars]"


def _value(value: Any) -> Any:
    """Attribute values are JSON strings, numbers or booleans."""
    if isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (tuple, list)):
        return json.dumps(list(value), ensure_ascii=False)
    return "" if value is None else str(value)


def code_location() -> tuple[str, str, int]:
    """(file relative to the agent root, qualified function, its first line) of the innermost
    frame of the agent's code that is not tracing machinery."""
    frame = sys._getframe(1)
    root = str(AGENT_ROOT) + "/"
    while frame is not None:
        filename = str(Path(frame.f_code.co_filename).resolve())
        if (filename.startswith(root) and not filename.startswith(_MACHINERY)
                and frame.f_code.co_name not in _WRAPPERS):
            rel = filename[len(root):]
            return rel, frame.f_code.co_qualname, frame.f_code.co_firstlineno
        frame = frame.f_back
    return "pydantic_ai_tasks/__main__.py", "main", 1


def span_kind(span: ReadableSpan) -> str:
    if span.name == "agent.run":
        return "agent"
    attrs = span.attributes or {}
    operation = str(attrs.get("gen_ai.operation.name", ""))
    if operation in _KINDS:
        return _KINDS[operation]
    if span.name.startswith("running tool"):
        return "chain"
    return "other"


class ContractWriter(SpanProcessor):
    """Writes every ended span to `path` in the contract's format."""

    def __init__(self, path: str) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "a", encoding="utf-8")
        self._lock = threading.Lock()
        self._open: dict[int, Any] = {}     # span id -> span, while the span is open
        self._parent: dict[int, int] = {}   # span id -> parent span id
        self._llm_calls = 0

    # --- SpanProcessor -----------------------------------------------------------------

    def on_start(self, span, parent_context=None) -> None:
        rel, function, line = code_location()
        span.set_attribute("code.filepath", rel)
        span.set_attribute("code.function", function)
        span.set_attribute("code.lineno", line)
        span.set_attribute("pathfinder.step_index", self._llm_calls)
        with self._lock:
            self._open[span.context.span_id] = span
            if span.parent is not None:
                self._parent[span.context.span_id] = span.parent.span_id

    def agent_name(self, span: ReadableSpan) -> str:
        """The span's own `gen_ai.agent.name`, else its nearest open ancestor's (Pydantic AI
        names the agent on its run span; the model and tool work under it inherits it)."""
        own = (span.attributes or {}).get("gen_ai.agent.name")
        if own:
            return str(own)
        parent = self._parent.get(span.context.span_id)
        while parent is not None:
            ancestor = self._open.get(parent)
            attrs = (ancestor.attributes or {}) if ancestor is not None else {}
            name = attrs.get("gen_ai.agent.name") or attrs.get("agent_name")
            if name:
                return str(name)
            parent = self._parent.get(parent)
        return "pydantic-ai"

    def on_end(self, span: ReadableSpan) -> None:
        with self._lock:
            record = self.contract_record(span)
            self._open.pop(span.context.span_id, None)
        line = json.dumps(record, ensure_ascii=False, sort_keys=True)
        with self._lock:
            if record["kind"] == "llm":
                self._llm_calls += 1
            if not self._file.closed:
                self._file.write(line + "\n")
                self._file.flush()

    def shutdown(self) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        with self._lock:
            if not self._file.closed:
                self._file.flush()
        return True

    # --- conversion ----------------------------------------------------------------------

    def contract_record(self, span: ReadableSpan) -> dict[str, Any]:
        attrs = {k: _value(v) for k, v in (span.attributes or {}).items()}
        kind = span_kind(span)
        attrs["gen_ai.agent.name"] = self.agent_name(span)
        if kind == "llm":
            attrs.setdefault("gen_ai.operation.name", "chat")
            if "gen_ai.input.messages" in attrs:
                attrs["input.value"] = clip(str(attrs["gen_ai.input.messages"]))
            if "gen_ai.output.messages" in attrs:
                attrs["output.value"] = clip(str(attrs["gen_ai.output.messages"]))
        elif kind == "tool":
            arguments = attrs.get("gen_ai.tool.call.arguments", attrs.get("tool_arguments", ""))
            result = attrs.get("gen_ai.tool.call.result", attrs.get("tool_response", ""))
            attrs["gen_ai.tool.call.arguments"] = str(arguments)
            attrs["input.value"] = clip(str(arguments))
            attrs["output.value"] = clip(str(result))
        elif kind == "agent" and span.name != "agent.run":
            if "final_result" in attrs:
                attrs.setdefault("output.value", clip(str(attrs["final_result"])))
        code = span.status.status_code
        message = span.status.description or ""
        for event in span.events:
            if event.name == "exception":
                ev = event.attributes or {}
                attrs.setdefault("error.type", _value(ev.get("exception.type", "")).rsplit(".", 1)[-1])
                attrs.setdefault("exception.message", clip(str(ev.get("exception.message", ""))))
                attrs.setdefault("exception.stacktrace", clip(str(ev.get("exception.stacktrace", ""))))
        if kind == "tool" and code != StatusCode.ERROR and attrs.get("error.type") in ("ToolError", "ModelRetry"):
            # The tool refused; Pydantic AI hands the refusal back to the model as a retry prompt.
            code = StatusCode.ERROR
            message = message or "tool call failed"
        if code == StatusCode.ERROR and not message:
            message = str(attrs.get("exception.message", ""))[:500]
        parent = span.parent.span_id if span.parent is not None else None
        return {
            "trace_id": f"{span.context.trace_id:032x}",
            "span_id": f"{span.context.span_id:016x}",
            "parent_span_id": f"{parent:016x}" if parent is not None else None,
            "name": span.name,
            "kind": kind,
            "start_time_unix_nano": span.start_time or 0,
            "end_time_unix_nano": span.end_time or 0,
            "status": {"code": code.name, "message": message},
            "attributes": attrs,
        }


def provider(path: str) -> tuple[TracerProvider, ContractWriter]:
    """A tracer provider whose every span goes to the contract file at `path`."""
    writer = ContractWriter(path)
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(writer)
    return tracer_provider, writer
