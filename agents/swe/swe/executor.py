"""Runs one parsed action against the environment and formats what it returns."""

from __future__ import annotations

import json
from dataclasses import dataclass

from .commands import ArgumentValidationError, prepare_arguments
from .environment import SWEEnvironment, ToolError
from .history import clip_middle
from .parsing import Action
from .tracing import Tracer


@dataclass
class Observation:
    text: str
    ok: bool
    error_type: str | None = None


class ToolExecutor:
    def __init__(self, env: SWEEnvironment, tracer: Tracer, max_chars: int) -> None:
        self.env = env
        self.tracer = tracer
        self.max_chars = max_chars

    def execute(self, action: Action, call_id: str) -> Observation:
        handler = getattr(self.env, action.command.handler)
        attributes = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": action.command.name,
            "gen_ai.tool.call.id": call_id,
            "gen_ai.tool.call.arguments": json.dumps(action.raw_arguments, ensure_ascii=False, sort_keys=True),
            "pathfinder.action.source": action.source,
            "input.value": action.text,
        }
        with self.tracer.span(f"execute_tool {action.command.name}", "tool", attributes) as span:
            try:
                arguments = prepare_arguments(action.command, action.raw_arguments)
                span.set_attribute(
                    "gen_ai.tool.call.arguments", json.dumps(arguments, ensure_ascii=False, sort_keys=True)
                )
                span.set_location(handler.__code__)
                output = handler(**arguments)
                observation = Observation(self.format_output(output), ok=True)
            except (ToolError, ArgumentValidationError) as exc:
                span.record_exception(exc)
                observation = Observation(f"ERROR: {exc}", ok=False, error_type=type(exc).__name__)
            span.set_attribute("output.value", observation.text)
            return observation

    def format_output(self, output: str) -> str:
        """Observation text for the model: trailing whitespace trimmed, long output clipped."""
        text = "\n".join(line.rstrip() for line in output.splitlines())
        return clip_middle(text, self.max_chars)
