"""read_file: a document of the corpus, or a range of its lines."""

from __future__ import annotations

from typing import Any

from . import corpus
from .base import Tool, ToolContext, ToolError


class ReadFile(Tool):
    name = "read_file"
    description = ("Read a document of the corpus by its path (as returned by search, e.g. "
                   "'harrowmere/lighthouse.md'). Optionally read only some lines.")
    parameters = {
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "Path relative to the corpus root."},
            "start_line": {"type": "integer", "minimum": 1, "default": 1,
                           "description": "First line to return (1-based)."},
            "max_lines": {"type": ["integer", "null"], "minimum": 1, "maximum": 400,
                          "description": "How many lines to return; null or absent for up to 200."},
        },
        "required": ["path"],
        "additionalProperties": False,
    }

    def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        path = corpus.resolve(ctx.corpus_dir, args["path"])
        lines = corpus.read_text(path).splitlines()
        start = args.get("start_line", 1)
        count = args.get("max_lines") or 200
        if start > max(len(lines), 1):
            raise ToolError(f"{args['path']} has only {len(lines)} lines")
        chosen = lines[start - 1:start - 1 + count]
        end = start - 1 + len(chosen)
        header = f"# {args['path']} (lines {start}-{end} of {len(lines)})"
        return "\n".join([header, *chosen])
