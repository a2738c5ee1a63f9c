"""The agent-computer interface's commands: documentation, JSON schemas, argument parsing.

Each command is described once; from that description come the docs in the system prompt,
the function-calling tool list, the parser for the fenced ``command args`` form and the
argument validator. Handlers live on :class:`swe.environment.SWEEnvironment`.
"""

from __future__ import annotations

import copy
import shlex
from dataclasses import dataclass, field
from typing import Any


class CommandSyntaxError(ValueError):
    """The command text does not match any command's syntax."""


class ArgumentValidationError(ValueError):
    """Arguments do not satisfy the command's schema."""


@dataclass
class Command:
    name: str
    signature: str
    docstring: str
    parameters: dict[str, Any]
    # Positional order used by the ``name arg1 arg2`` form.
    positional: tuple[str, ...] = ()
    # Multi-line commands read their last argument up to this terminator line.
    end_name: str | None = None
    handler: str = ""
    examples: tuple[str, ...] = field(default_factory=tuple)

    def tool_schema(self) -> dict[str, Any]:
        """OpenAI function-calling tool entry; ``$ref`` is inlined for the provider."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.docstring,
                "parameters": resolve_refs(self.parameters),
            },
        }


_LINE_DEFS = {
    "LineNumber": {"type": "integer", "minimum": 1, "description": "A 1-based line number."}
}

COMMANDS: tuple[Command, ...] = (
    Command(
        name="open",
        signature="open <path> [<line_number>]",
        docstring="Opens the file at the given path in the editor. If line_number is given, "
        "the window is moved to include that line.",
        parameters={
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "The path to the file to open."},
                "line_number": {
                    "anyOf": [{"type": "integer", "minimum": 1}, {"type": "null"}],
                    "description": "The line number to move the window to (optional).",
                },
            },
            "required": ["path"],
            "additionalProperties": False,
        },
        positional=("path", "line_number"),
        handler="open_file",
    ),
    Command(
        name="goto",
        signature="goto <line_number>",
        docstring="Moves the window to show <line_number>.",
        parameters={
            "type": "object",
            "properties": {"line_number": {"$ref": "#/$defs/LineNumber"}},
            "required": ["line_number"],
            "additionalProperties": False,
            "$defs": _LINE_DEFS,
        },
        positional=("line_number",),
        handler="goto",
    ),
    Command(
        name="scroll_down",
        signature="scroll_down",
        docstring="Moves the window down by the window size.",
        parameters={"type": "object", "properties": {}, "additionalProperties": False},
        handler="scroll_down",
    ),
    Command(
        name="scroll_up",
        signature="scroll_up",
        docstring="Moves the window up by the window size.",
        parameters={"type": "object", "properties": {}, "additionalProperties": False},
        handler="scroll_up",
    ),
    Command(
        name="search_dir",
        signature="search_dir <search_term> [<dir>]",
        docstring="Searches for search_term in all files in dir (default: the repository "
        "root) and lists the files with their match counts.",
        parameters={
            "type": "object",
            "properties": {
                "search_term": {"type": "string", "description": "The text to search for."},
                "dir": {"type": "string", "description": "The directory to search (optional)."},
            },
            "required": ["search_term"],
            "additionalProperties": False,
        },
        positional=("search_term", "dir"),
        handler="search_dir",
    ),
    Command(
        name="search_file",
        signature="search_file <search_term> [<file>]",
        docstring="Searches for search_term in file (default: the open file) and lists the "
        "matching lines with their line numbers.",
        parameters={
            "type": "object",
            "properties": {
                "search_term": {"type": "string", "description": "The text to search for."},
                "file": {"type": "string", "description": "The file to search (optional)."},
            },
            "required": ["search_term"],
            "additionalProperties": False,
        },
        positional=("search_term", "file"),
        handler="search_file",
    ),
    Command(
        name="find_file",
        signature="find_file <file_name> [<dir>]",
        docstring="Finds files whose name matches file_name (shell wildcards allowed) in dir "
        "(default: the repository root).",
        parameters={
            "type": "object",
            "properties": {
                "file_name": {"type": "string", "description": "The file name or pattern."},
                "dir": {"type": "string", "description": "The directory to search (optional)."},
            },
            "required": ["file_name"],
            "additionalProperties": False,
        },
        positional=("file_name", "dir"),
        handler="find_file",
    ),
    Command(
        name="edit",
        signature="edit <start_line>:<end_line>\n<replacement_text>\nend_of_edit",
        docstring="Replaces lines start_line through end_line (inclusive) of the open file "
        "with the replacement text, which ends at a line containing only end_of_edit. To "
        "insert without replacing, use end_line = start_line - 1. Python files are "
        "syntax-checked after the edit; an edit that breaks the syntax is rolled back and "
        "the error is shown.",
        parameters={
            "type": "object",
            "properties": {
                "start_line": {"$ref": "#/$defs/LineNumber"},
                "end_line": {"type": "integer", "minimum": 0, "description": "The last line to replace."},
                "replacement_text": {"type": "string", "description": "The new lines, properly indented."},
            },
            "required": ["start_line", "end_line", "replacement_text"],
            "additionalProperties": False,
            "$defs": _LINE_DEFS,
        },
        positional=("start_line", "end_line", "replacement_text"),
        end_name="end_of_edit",
        handler="edit",
        examples=("edit 12:13\n    return total\nend_of_edit",),
    ),
    Command(
        name="create",
        signature="create <filename>",
        docstring="Creates and opens a new, empty file.",
        parameters={
            "type": "object",
            "properties": {"filename": {"type": "string", "description": "The file to create."}},
            "required": ["filename"],
            "additionalProperties": False,
        },
        positional=("filename",),
        handler="create",
    ),
    Command(
        name="run_tests",
        signature="run_tests [<test_id> ...]",
        docstring="Runs the repository's test command, or only the given unittest ids "
        "(e.g. tests.test_parser.ParserTest.test_empty), and shows the output.",
        parameters={
            "type": "object",
            "properties": {
                "test_ids": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "unittest ids to run (optional; default: the whole suite).",
                },
                "verbosity": {
                    "type": "string",
                    "enum": ["quiet", "normal", "verbose"],
                    "description": "How much output to show (optional, default quiet).",
                },
            },
            "additionalProperties": False,
        },
        positional=("test_ids",),
        handler="run_tests",
    ),
    Command(
        name="submit",
        signature="submit",
        docstring="Submits the current changes to the repository as the solution.",
        parameters={"type": "object", "properties": {}, "additionalProperties": False},
        handler="submit",
    ),
)


class CommandRegistry:
    """Lookup, documentation and parsing for the command set."""

    def __init__(self, commands: tuple[Command, ...] = COMMANDS) -> None:
        self.commands = {c.name: c for c in commands}

    def __contains__(self, name: str) -> bool:
        return name in self.commands

    def get(self, name: str) -> Command:
        try:
            return self.commands[name]
        except KeyError:
            known = ", ".join(self.commands)
            raise CommandSyntaxError(f"unknown command {name!r}; available commands: {known}") from None

    def docs(self) -> str:
        lines = []
        for command in self.commands.values():
            lines.append(f"{command.signature}\n  {command.docstring}")
        return "\n".join(lines)

    def tool_schemas(self) -> list[dict[str, Any]]:
        return [c.tool_schema() for c in self.commands.values()]

    def parse_command_text(self, text: str) -> tuple[Command, dict[str, Any]]:
        """Parse ``name args`` (and a multi-line body for ``edit``) into raw arguments."""
        text = text.strip("\n")
        if not text.strip():
            raise CommandSyntaxError("the command block is empty")
        first, _, rest = text.partition("\n")
        try:
            words = shlex.split(first)
        except ValueError as exc:
            raise CommandSyntaxError(f"cannot split the command line: {exc}") from None
        command = self.get(words[0])
        args = words[1:]
        if command.name == "edit":
            return command, self._parse_edit(command, args, rest)
        if rest.strip():
            raise CommandSyntaxError(
                f"{command.name} takes a single line; run one command at a time"
            )
        if command.name == "run_tests":
            return command, {"test_ids": args} if args else {}
        if len(args) > len(command.positional):
            raise CommandSyntaxError(f"too many arguments; usage: {command.signature}")
        return command, dict(zip(command.positional, args))

    @staticmethod
    def _parse_edit(command: Command, args: list[str], body: str) -> dict[str, Any]:
        if len(args) != 1 or ":" not in args[0]:
            raise CommandSyntaxError(f"usage: {command.signature}")
        start, _, end = args[0].partition(":")
        lines = body.split("\n")
        if command.end_name not in (line.strip() for line in lines):
            raise CommandSyntaxError(f"the edit text must end with a line containing only {command.end_name}")
        terminator = next(i for i, line in enumerate(lines) if line.strip() == command.end_name)
        if any(line.strip() for line in lines[terminator + 1 :]):
            raise CommandSyntaxError(f"nothing may follow {command.end_name}; run one command at a time")
        replacement = "\n".join(lines[:terminator])
        return {"start_line": start, "end_line": end, "replacement_text": replacement}


def resolve_refs(schema: dict[str, Any]) -> dict[str, Any]:
    """Inline local ``#/$defs/...`` references and drop ``$defs``.

    Some providers reject ``$ref``. A definition that refers to itself (directly or through
    others) is inlined once and its inner reference is replaced by a plain object schema, so
    recursive definitions terminate.
    """
    definitions = schema.get("$defs", {})

    def inline(node: Any, active: tuple[str, ...]) -> Any:
        if isinstance(node, list):
            return [inline(item, active) for item in node]
        if not isinstance(node, dict):
            return node
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            name = ref[len("#/$defs/") :]
            if name in active:
                return {"type": "object", "description": f"(recursive {name})"}
            if name not in definitions:
                raise ValueError(f"schema refers to unknown definition {name!r}")
            merged = {k: v for k, v in node.items() if k != "$ref"}
            resolved = inline(copy.deepcopy(definitions[name]), active + (name,))
            resolved.update(merged)
            return resolved
        return {k: inline(v, active) for k, v in node.items() if k != "$defs"}

    return inline(schema, ())


_TYPE_CHECKS = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
}


def _coerce(schema: dict[str, Any], value: Any) -> Any:
    """Turn command-line strings into the schema's scalar type where that is unambiguous."""
    if not isinstance(value, str):
        return value
    options = schema.get("anyOf") or [schema]
    for option in options:
        kind = option.get("type")
        if kind == "integer":
            try:
                return int(value)
            except ValueError:
                continue
        if kind == "number":
            try:
                return float(value)
            except ValueError:
                continue
    return value


def validate(schema: dict[str, Any], value: Any, path: str = "arguments") -> list[str]:
    """Errors of ``value`` against a (ref-free) JSON schema subset; empty when valid."""
    errors: list[str] = []
    if "anyOf" in schema:
        branches = [validate(option, value, path) for option in schema["anyOf"]]
        if all(branches):
            errors.append(f"{path}: {value!r} matches none of the allowed types")
        return errors
    kind = schema.get("type")
    if kind and not _TYPE_CHECKS[kind](value):
        errors.append(f"{path}: expected {kind}, got {type(value).__name__} {value!r}")
        return errors
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: {value!r} is not one of {schema['enum']}")
    if "minimum" in schema and isinstance(value, (int, float)) and value < schema["minimum"]:
        errors.append(f"{path}: {value} is below the minimum {schema['minimum']}")
    if kind == "array" and "items" in schema:
        for i, item in enumerate(value):
            errors.extend(validate(schema["items"], item, f"{path}[{i}]"))
    if kind == "object":
        properties = schema.get("properties", {})
        for name in schema.get("required", []):
            if name not in value:
                errors.append(f"{path}: missing required argument {name!r}")
        for name, item in value.items():
            if name not in properties:
                if schema.get("additionalProperties") is False:
                    errors.append(f"{path}: unexpected argument {name!r}")
                continue
            errors.extend(validate(properties[name], item, f"{path}.{name}"))
    return errors


def prepare_arguments(command: Command, raw: dict[str, Any]) -> dict[str, Any]:
    """Drop omitted optionals, coerce strings from the text form, then validate."""
    schema = resolve_refs(command.parameters)
    properties = schema.get("properties", {})
    arguments = {}
    for name, value in raw.items():
        if value is None and name not in schema.get("required", []):
            continue
        arguments[name] = _coerce(properties.get(name, {}), value)
    errors = validate(schema, arguments)
    if errors:
        raise ArgumentValidationError("; ".join(errors) + f"\nusage: {command.signature}")
    return arguments
