"""Turning a model reply into one action.

Three shapes are accepted, tried in this order:

1. a function call (``tool_calls`` on the reply) — the function-calling interface;
2. a discussion followed by one fenced command block — SWE-agent's thought/action format;
3. a JSON object naming the command and its arguments, bare or in a ```json fence — what
   models trained on function calling tend to write when no tools are bound.

A reply that fits none of them raises :class:`FormatError`; the agent shows the model the
format again and asks once more.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from .commands import Command, CommandRegistry, CommandSyntaxError
from .llm import ModelResponse

_FENCE = re.compile(r"^```([\w+-]*)[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


def _is_json_block(lang: str, body: str) -> bool:
    """A ```json block, or a bare fence around a JSON object (not a command)."""
    if lang.lower() == "json":
        return True
    stripped = body.strip()
    if lang or not stripped.startswith("{"):
        return False
    try:
        return isinstance(json.loads(stripped), dict)
    except ValueError:
        return False


class FormatError(ValueError):
    """The reply does not contain exactly one well-formed action."""


@dataclass
class Action:
    thought: str
    command: Command
    raw_arguments: dict[str, Any]
    # How the action reads in the transcript (the fenced text or a rendering of the call).
    text: str
    source: str  # "text" | "function" | "json"
    call_id: str | None = None


def extract_json_object(text: str) -> dict[str, Any] | None:
    """The first JSON object in ``text``, looking inside Markdown code fences first."""
    candidates = [body for lang, body in _FENCE.findall(text) if lang.lower() in ("json", "")]
    candidates.append(text)
    decoder = json.JSONDecoder()
    for candidate in candidates:
        stripped = candidate.strip()
        for start in [i for i, ch in enumerate(stripped) if ch == "{"][:20]:
            try:
                value, _ = decoder.raw_decode(stripped, start)
            except ValueError:
                continue
            if isinstance(value, dict):
                return value
    return None


class ActionParser:
    def __init__(self, registry: CommandRegistry, mode: str) -> None:
        if mode not in ("auto", "thought_action", "function_calling"):
            raise ValueError(f"parse_mode: unknown mode {mode!r}")
        self.registry = registry
        self.mode = mode

    def parse(self, response: ModelResponse) -> Action:
        if response.tool_calls:
            if self.mode == "thought_action":
                raise FormatError("function calls are not accepted; write the command in a fenced block")
            return self._parse_function_call(response)
        if self.mode == "function_calling":
            action = self._parse_json_action(response.content)
            if action is None:
                raise FormatError("no function call found; call exactly one of the tools")
            return action
        return self._parse_thought_action(response.content)

    def _parse_function_call(self, response: ModelResponse) -> Action:
        if len(response.tool_calls) != 1:
            raise FormatError(f"{len(response.tool_calls)} function calls in one reply; call exactly one tool")
        call = response.tool_calls[0]
        try:
            command = self.registry.get(call.name)
        except CommandSyntaxError as exc:
            raise FormatError(str(exc)) from None
        try:
            arguments = json.loads(call.arguments) if call.arguments.strip() else {}
        except ValueError as exc:
            raise FormatError(f"the arguments of {call.name} are not valid JSON: {exc}") from None
        if not isinstance(arguments, dict):
            raise FormatError(f"the arguments of {call.name} must be a JSON object")
        rendered = f"{command.name} {json.dumps(arguments, ensure_ascii=False)}"
        return Action(response.content.strip(), command, arguments, rendered, "function", call.call_id)

    def _parse_thought_action(self, content: str) -> Action:
        blocks = [m for m in _FENCE.finditer(content) if not _is_json_block(m.group(1), m.group(2))]
        if not blocks:
            action = self._parse_json_action(content)
            if action is not None:
                return action
            raise FormatError("no fenced command block found")
        last = blocks[-1]
        body = last.group(2)
        thought = content[: last.start()].strip()
        if thought.upper().startswith("DISCUSSION"):
            thought = thought[len("DISCUSSION") :].strip()
        try:
            command, arguments = self.registry.parse_command_text(body)
        except CommandSyntaxError as exc:
            raise FormatError(str(exc)) from None
        return Action(thought, command, arguments, body.strip("\n"), "text")

    def _parse_json_action(self, content: str) -> Action | None:
        obj = extract_json_object(content)
        if obj is None:
            return None
        name = obj.get("command") or obj.get("name") or obj.get("tool")
        arguments = obj.get("arguments", obj.get("args", {}))
        if not isinstance(name, str):
            return None
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                raise FormatError(f"the arguments of {name} are not valid JSON") from None
        if not isinstance(arguments, dict):
            raise FormatError(f"the arguments of {name} must be a JSON object")
        try:
            command = self.registry.get(name)
        except CommandSyntaxError as exc:
            raise FormatError(str(exc)) from None
        thought = str(obj.get("thought") or obj.get("discussion") or "")
        rendered = f"{command.name} {json.dumps(arguments, ensure_ascii=False)}"
        return Action(thought, command, arguments, rendered, "json")
