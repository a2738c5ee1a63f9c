"""Tools: their schemas, the registry the model sees, and the executor that runs calls.

A call goes through four stages, each its own function so that each can be reasoned about
(and broken) on its own: argument parsing, schema validation, execution, output formatting.
Several calls of one reply run concurrently in threads; their results come back in call order.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor, TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any, Callable

from .. import schema as jsonschema
from ..callbacks import Callbacks
from ..llm import ToolCall
from ..parsing import parse_arguments
from ..tracing import Tracer, clip


class ToolError(Exception):
    """A tool could not do what was asked; the message is shown to the model."""


@dataclass
class ToolContext:
    """State shared by all tool calls of a run (and by concurrent calls of one step)."""

    corpus_dir: str
    cache: dict[str, str] = field(default_factory=dict)
    calls_made: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def remember(self, key: str, output: str) -> None:
        with self.lock:
            self.cache[key] = output
            self.calls_made += 1

    def recall(self, key: str) -> str | None:
        with self.lock:
            return self.cache.get(key)


class Tool:
    """A function the model can call. Subclasses set `name`, `description`, `parameters`
    and implement `run(args, ctx) -> str`."""

    name: str = ""
    description: str = ""
    parameters: dict[str, Any] = {"type": "object", "properties": {}}
    cacheable: bool = True
    # Each tool stands for a service (a search API, a document store, a table service, a
    # calculator endpoint) whose answer takes a round trip. A fixed one, longer than the
    # scheduler's delays on a busy machine, also means parallel calls finish in the same order
    # relative to the executor's checks on any machine and load, so a run's outcome is the
    # same everywhere (a corpus's digest covers which calls timed out).
    round_trip_s: float = 0.1

    def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        raise NotImplementedError

    def schema(self) -> dict[str, Any]:
        """The OpenAI function-calling definition."""
        return {"type": "function",
                "function": {"name": self.name, "description": self.description,
                             "parameters": self.parameters}}


class ToolRegistry:
    """The tools offered to the model, by name."""

    def __init__(self) -> None:
        self._tools: dict[str, Tool] = {}

    def register(self, tool: Tool) -> None:
        if not tool.name or tool.name in self._tools:
            raise ValueError(f"tool name {tool.name!r} is empty or already registered")
        self._tools[tool.name] = tool

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return list(self._tools)

    def subset(self, names: list[str]) -> "ToolRegistry":
        """A registry with only `names` (unknown names are ignored)."""
        out = ToolRegistry()
        for name in names:
            if name in self._tools:
                out.register(self._tools[name])
        return out

    def schemas(self) -> list[dict[str, Any]]:
        return [tool.schema() for tool in self._tools.values()]


@dataclass
class ToolOutcome:
    call: ToolCall
    output: str
    ok: bool


MAX_OUTPUT_CHARS = 4000


def format_output(output: Any, limit: int = MAX_OUTPUT_CHARS) -> str:
    """Tool output as text for the model: strings as they are, other values as JSON, long
    outputs cut with a note saying how much was left out."""
    if not isinstance(output, str):
        output = json.dumps(output, ensure_ascii=False)
    output = output.replace("\x00", "")
    if len(output) > limit:
        return output[:limit] + f"\n[... {len(output) - limit} more characters not shown]"
    return output


def validate_arguments(tool: Tool, args: dict[str, Any]) -> dict[str, Any]:
    """The arguments with defaults applied; raises ToolError listing every violation."""
    errors = jsonschema.validate(args, tool.parameters)
    if errors:
        raise ToolError("invalid arguments for {}: {}".format(tool.name, "; ".join(errors)))
    return jsonschema.apply_defaults(args, tool.parameters)


class ToolExecutor:
    """Runs the tool calls of one model reply."""

    def __init__(self, registry: ToolRegistry, ctx: ToolContext, tracer: Tracer,
                 callbacks: Callbacks, timeout: float = 30.0, max_workers: int = 4) -> None:
        self.registry = registry
        self.ctx = ctx
        self.tracer = tracer
        self.callbacks = callbacks
        self.timeout = timeout
        self.max_workers = max_workers

    def run_all(self, calls: list[ToolCall]) -> list[ToolOutcome]:
        """Every call's outcome, in call order. Calls run concurrently when there are several;
        a call that does not finish within the timeout gets an error outcome."""
        spans = [self.tracer.span("tool.execute", kind="tool", deferred=True,
                                  code=self._located_at(c), attributes={
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": c.name,
            "gen_ai.tool.call.id": c.id,
            "gen_ai.tool.call.arguments": c.arguments,
            "input.value": c.arguments,
        }) for c in calls]
        if len(calls) == 1:
            outcomes = [self.execute(calls[0], spans[0])]
        else:
            with ThreadPoolExecutor(max_workers=self.max_workers) as pool:
                futures = [pool.submit(self.execute, c, s) for c, s in zip(calls, spans)]
                outcomes = []
                deadline = time.monotonic() + self.timeout
                for call, span, future in zip(calls, spans, futures):
                    try:
                        outcomes.append(future.result(timeout=max(0.0, deadline - time.monotonic())))
                    except FutureTimeout:
                        span.error(message=f"timed out after {self.timeout}s")
                        outcomes.append(ToolOutcome(call, f"Error: {call.name} timed out", False))
        for span in spans:
            self.tracer.emit(span)
        return outcomes

    def _located_at(self, call: ToolCall):
        """Tool spans point at the tool's own `run`; calls of unknown tools at the executor."""
        tool = self.registry.get(call.name)
        return type(tool).run if tool is not None else ToolExecutor.execute

    def execute(self, call: ToolCall, span) -> ToolOutcome:
        """One call: parse, validate, run, format. Failures become an error text for the model."""
        with span:
            self.callbacks.emit("tool_start", name=call.name, arguments=call.arguments)
            try:
                tool = self.registry.get(call.name)
                if tool is None:
                    raise ToolError(f"unknown tool {call.name!r}; available: {', '.join(self.registry.names())}")
                try:
                    args = parse_arguments(call.arguments)
                except ValueError as exc:
                    raise ToolError(f"{call.name}: {exc}") from exc
                args = validate_arguments(tool, args)
                time.sleep(tool.round_trip_s)
                key = f"{tool.name}:{json.dumps(args, sort_keys=True, ensure_ascii=False)}"
                cached = self.ctx.recall(key) if tool.cacheable else None
                if cached is not None:
                    span.set("pathfinder.tool.cached", True)
                    output = cached
                else:
                    output = format_output(tool.run(args, self.ctx))
                    self.ctx.remember(key, output)
                outcome = ToolOutcome(call, output, True)
            except ToolError as exc:
                span.error(exc)
                outcome = ToolOutcome(call, f"Error: {exc}", False)
            except Exception as exc:  # a bug in a tool must not end the run
                span.error(exc)
                outcome = ToolOutcome(call, f"Error: {call.name} failed: {type(exc).__name__}: {exc}", False)
            span.set("output.value", clip(outcome.output))
            self.callbacks.emit("tool_end", name=call.name, ok=outcome.ok)
            return outcome


ToolFactory = Callable[[], Tool]
