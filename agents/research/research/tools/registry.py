"""The tools offered to researchers: names, descriptions, schemas, execution and output format.

Descriptions say what each tool returns and how it fails, because the model only sees this
text. Execution never raises into the research loop: a refused or failing call becomes a tool
result that says what went wrong, and the tool span is marked ERROR.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

from research import tokens
from research.config import Limits
from research.llm.stream import ToolCall
from research.summarize import summarize_text
from research.textnorm import nfc
from research.tools import schema
from research.tools.calculator import calculate
from research.tools.corpus import Corpus, ToolError
from research.tracing import Tracer, code_location


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]
    run: Callable[[dict[str, Any]], str]
    # Prose can be summarised to its relevant lines; table rows are data, never dropped one by
    # one (a long table result is clipped whole with a marker asking for a narrower filter).
    summarisable: bool = True

    def spec(self) -> dict[str, Any]:
        return {"type": "function", "function": {
            "name": self.name, "description": self.description, "parameters": self.parameters}}


@dataclass(frozen=True)
class ToolOutcome:
    call_id: str
    name: str
    arguments: dict[str, Any] | None
    output: str
    ok: bool
    summarised: bool = False

    def as_message(self) -> dict[str, Any]:
        return {"role": "tool", "tool_call_id": self.call_id, "content": self.output}


TABLE_BUDGET_FACTOR = 4


def clip_lines(text: str, budget: int) -> str:
    """Whole lines from the top within `budget` tokens, and a marker with what was cut."""
    lines = text.splitlines()
    kept: list[str] = []
    used = 0
    for line in lines:
        cost = tokens.count_text(line)
        if used + cost > budget - 24:
            break
        kept.append(line)
        used += cost
    kept.append(f"[clipped: {len(lines) - len(kept)} more line(s); narrow the filter or ask "
                "for fewer columns]")
    return "\n".join(kept)


class ArgumentError(ValueError):
    """Tool-call arguments are not a JSON object."""


class ToolRegistry:
    def __init__(self, corpus: Corpus, tracer: Tracer, limits: Limits):
        self.corpus = corpus
        self.tracer = tracer
        self.limits = limits
        self._tools: dict[str, Tool] = {}
        for tool in self._builtin_tools():
            self.register(tool)

    def register(self, tool: Tool) -> None:
        if tool.name in self._tools:
            raise ValueError(f"tool {tool.name!r} registered twice")
        self._tools[tool.name] = tool

    def names(self) -> list[str]:
        return list(self._tools)

    def specs(self) -> list[dict[str, Any]]:
        return [tool.spec() for tool in self._tools.values()]

    # -- the built-in tools -----------------------------------------------------------------

    def _builtin_tools(self) -> list[Tool]:
        tables = self.corpus.table_names()
        return [
            Tool(
                "search",
                "Keyword search over the document collection (not the tables). Returns up to "
                "`limit` documents ranked by how many of the query's words they contain, one "
                "per line: 'N. PATH (matched K terms): SNIPPET'. Returns 'No documents match' "
                "when nothing matches. Read a document with read_file to see all of it.",
                schema.search_parameters(),
                self.run_search,
            ),
            Tool(
                "read_file",
                "Returns the full text of one document or table file by its corpus-relative "
                "path (as shown by search), after a 'File: PATH' line. Fails with a message "
                "when the path does not exist or leaves the corpus. Long files are summarised "
                "to the lines most relevant to your sub-question, with a marker saying so.",
                schema.read_file_parameters(),
                self.run_read_file,
            ),
            Tool(
                "table_lookup",
                "Returns rows of a data table as one JSON object per line (all values are "
                f"strings), after a header line with the row count. Tables: {', '.join(tables)}. "
                "Filter with `where` ({column, value, match}); without it every row is returned. "
                "Unknown tables or columns fail with a message listing the valid ones.",
                schema.table_lookup_parameters(tables),
                self.run_table_lookup,
                summarisable=False,
            ),
            Tool(
                "calculator",
                "Evaluates one arithmetic expression exactly and returns 'EXPRESSION = RESULT'. "
                "Whole results print without decimals; others with up to 12 significant digits. "
                "Fails with a message on syntax errors, unknown functions or division by zero.",
                schema.calculator_parameters(),
                self.run_calculator,
                summarisable=False,
            ),
        ]

    def run_search(self, args: dict[str, Any]) -> str:
        limit = args.get("limit")
        hits = self.corpus.search(args["query"], 5 if limit is None else limit)
        if not hits:
            return f"No documents match {args['query']!r}."
        lines = [f"Found {len(hits)} document(s) for {args['query']!r}:"]
        for rank, hit in enumerate(hits, 1):
            lines.append(f"{rank}. {hit.path} (matched {hit.score} terms): {hit.snippet}")
        return "\n".join(lines)

    def run_read_file(self, args: dict[str, Any]) -> str:
        return f"File: {args['path']}\n\n{self.corpus.read_file(args['path'])}"

    def run_table_lookup(self, args: dict[str, Any]) -> str:
        where = args.get("where") or {}
        rows = self.corpus.table_lookup(
            args["table"],
            column=where.get("column"),
            value=where.get("value"),
            match=where.get("match", "exact"),
            columns=args.get("columns"),
        )
        head = f"Table {args['table']}: {len(rows)} row(s)"
        if where:
            head += f" where {where['column']} {where.get('match', 'exact')} {where['value']!r}"
        return "\n".join([head + ":"] + [json.dumps(r, ensure_ascii=False) for r in rows])

    def run_calculator(self, args: dict[str, Any]) -> str:
        return f"{args['expression']} = {calculate(args['expression'])}"

    # -- execution --------------------------------------------------------------------------

    @staticmethod
    def parse_arguments(raw: str) -> dict[str, Any]:
        text = (raw or "").strip() or "{}"
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ArgumentError(
                f"arguments are not valid JSON (char {exc.pos}: {exc.msg}): {text[:200]!r}"
            ) from None
        if not isinstance(value, dict):
            raise ArgumentError(f"arguments must be a JSON object, got {type(value).__name__}")
        return value

    def execute(self, call: ToolCall, focus: str) -> ToolOutcome:
        """Validates and runs one call; `focus` (the sub-question) guides summarisation."""
        tool = self._tools.get(call.name)
        implementation = tool.run if tool else self.execute
        attrs = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": call.name,
            "gen_ai.tool.call.id": call.id,
            "gen_ai.tool.call.arguments": call.arguments,
            "input.value": call.arguments,
        }
        with self.tracer.span(f"execute_tool {call.name}", "tool", attrs,
                              code=implementation) as span:
            args: dict[str, Any] | None = None
            try:
                if tool is None:
                    raise ToolError(f"unknown tool {call.name!r}; available: "
                                    + ", ".join(self._tools))
                stage: Callable[..., Any] = self.parse_arguments
                args = self.parse_arguments(call.arguments)
                stage = schema.validate
                args = schema.validate(args, tool.parameters)
                stage = tool.run
                output = nfc(tool.run(args))
            except (ToolError, ArgumentError, schema.ValidationError, schema.SchemaError) as exc:
                span.set(code_location(stage if tool else self.execute))
                span.error(str(exc), type(exc).__name__)
                message = f"Error from {call.name}: {exc}"
                span.set({"output.value": message})
                return ToolOutcome(call.id, call.name, args, message, ok=False)
            except Exception as exc:  # a broken tool must not end the research
                span.record_exception(exc)
                message = f"Error from {call.name}: the tool failed ({type(exc).__name__}: {exc})"
                span.set({"output.value": message})
                return ToolOutcome(call.id, call.name, args, message, ok=False)
            summarised = False
            budget = self.limits.tool_output_tokens
            if not tool.summarisable and tokens.count_text(output) > budget * TABLE_BUDGET_FACTOR:
                output = clip_lines(output, budget * TABLE_BUDGET_FACTOR)
                summarised = True
            elif tool.summarisable and tokens.count_text(output) > budget:
                with self.tracer.span("summarize.tool_output", "chain",
                                      code=summarize_text) as sum_span:
                    summary = summarize_text(output, focus, budget)
                    sum_span.set({
                        "pathfinder.summary.original_tokens": summary.original_tokens,
                        "pathfinder.summary.tokens": summary.tokens,
                        "pathfinder.summary.kept_lines": summary.kept_lines,
                        "pathfinder.summary.total_lines": summary.total_lines,
                        "input.value": output,
                        "output.value": summary.text,
                    })
                output, summarised = summary.text, summary.shortened
            span.set({"output.value": output, "pathfinder.output.summarised": summarised,
                      "pathfinder.output.tokens": tokens.count_text(output)})
            return ToolOutcome(call.id, call.name, args, output, ok=True, summarised=summarised)
