"""Function tools: schema, validation, concurrent execution and result formatting."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import typing
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from ..messages import ToolCallRequest
from ..tracing import current_span, location_of, traced
from .corpus import ToolError
from .schema import ArgumentError, drop_null_optionals, function_schema, validate


@dataclass
class ToolResult:
    call_id: str
    name: str
    arguments: dict[str, Any]
    content: str
    ok: bool
    value: Any = None


class FunctionTool:
    """A Python callable offered to the model as a function."""

    def __init__(self, func: Callable[..., Any]) -> None:
        self.func = func
        self.schema = function_schema(func)
        self.name = self.schema["name"]
        self._hints = typing.get_type_hints(func)

    def openai_tool(self) -> dict[str, Any]:
        return {"type": "function", "function": self.schema}

    def parse_arguments(self, raw: str) -> dict[str, Any]:
        """Decode and validate the model's argument text; dataclass parameters are built."""
        try:
            arguments = json.loads(raw) if raw.strip() else {}
        except ValueError as exc:
            raise ArgumentError(f"arguments are not valid JSON: {exc}") from None
        if not isinstance(arguments, dict):
            raise ArgumentError("arguments must be a JSON object")
        parameters = self.schema["parameters"]
        arguments = drop_null_optionals(arguments, parameters)
        validate(arguments, parameters, parameters)
        return arguments

    def build(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """Turn validated JSON values into the function's argument objects."""
        built = {}
        for name, value in arguments.items():
            hint = self._hints.get(name)
            target = next((a for a in typing.get_args(hint) if dataclasses.is_dataclass(a)), hint)
            if dataclasses.is_dataclass(target) and isinstance(value, dict):
                value = target(**value)
            built[name] = value
        return built


class Toolkit:
    """The tools one role may use, by name."""

    def __init__(self, functions: list[Callable[..., Any]]) -> None:
        self.tools = {tool.name: tool for tool in (FunctionTool(f) for f in functions)}

    def openai_tools(self) -> list[dict[str, Any]]:
        return [tool.openai_tool() for tool in self.tools.values()]

    def names(self) -> list[str]:
        return list(self.tools)

    def get(self, name: str) -> FunctionTool:
        if name not in self.tools:
            raise ToolError(f"unknown tool {name!r}; available tools: {', '.join(self.tools)}")
        return self.tools[name]


def format_tool_output(value: Any, max_chars: int) -> str:
    """What the model reads: JSON for structured results, text as is, long text clipped with a note."""
    if isinstance(value, str):
        text = value
    else:
        text = json.dumps(value, ensure_ascii=False)
        if value == []:
            text = "[] (no results)"
    if len(text) > max_chars:
        text = f"{text[:max_chars]}\n[clipped: showing the first {max_chars} of {len(text)} characters]"
    return text


ResultCallback = Callable[[ToolResult, int], Awaitable[None]]


class ToolExecutor:
    """Runs a reply's tool calls concurrently.

    Results come back in call order, and the result callbacks (which write shared
    state) are committed in call order too: each call waits for the one before it to
    commit, so concurrent tools never reorder what other agents see.
    """

    def __init__(self, toolkit: Toolkit, max_output_chars: int = 4000) -> None:
        self.toolkit = toolkit
        self.max_output_chars = max_output_chars
        self._callbacks: list[ResultCallback] = []

    def add_result_callback(self, callback: ResultCallback) -> None:
        self._callbacks.append(callback)

    async def run_calls(self, calls: list[ToolCallRequest]) -> list[ToolResult]:
        committed = [asyncio.Event() for _ in calls]
        return list(await asyncio.gather(*(self.run_call(call, i, committed) for i, call in enumerate(calls))))

    @traced("tool.call", "tool", attributes=lambda self, call, index=0, committed=None: {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": call.name,
        "gen_ai.tool.call.id": call.call_id,
        "gen_ai.tool.call.arguments": call.arguments,
        "pathfinder.tool.call_index": index,
        "input.value": call.arguments,
    })
    async def run_call(self, call: ToolCallRequest, index: int = 0, committed: list[asyncio.Event] | None = None) -> ToolResult:
        span = current_span()
        arguments: dict[str, Any] = {}
        try:
            try:
                tool = self.toolkit.get(call.name)
                if span is not None:
                    span.name = f"execute_tool {tool.name}"
                    span.attributes.update(location_of(getattr(tool.func, "__func__", tool.func).__code__))
                arguments = tool.parse_arguments(call.arguments)
                value = await asyncio.to_thread(tool.func, **tool.build(arguments))
                content = format_tool_output(value, self.max_output_chars)
                result = ToolResult(call.call_id, call.name, arguments, content, True, value)
            except (ToolError, ArgumentError) as exc:
                if span is not None:
                    span.fail(exc)
                result = ToolResult(call.call_id, call.name, arguments, f"Error: {exc}", False)
            if span is not None:
                span.set("output.value", result.content)
            if committed is not None and index > 0:
                await committed[index - 1].wait()
            for callback in list(self._callbacks):
                await callback(result, index)
            return result
        finally:
            if committed is not None:
                committed[index].set()
