"""Tools the assistant role can call: the corpus tools and the machinery around them."""

from .corpus import ColumnFilter, CorpusToolkit, ToolError
from .function_tool import FunctionTool, ToolExecutor, ToolResult, Toolkit, format_tool_output
from .schema import ArgumentError, SchemaError, function_schema, validate

__all__ = [
    "ArgumentError",
    "ColumnFilter",
    "CorpusToolkit",
    "FunctionTool",
    "SchemaError",
    "ToolError",
    "ToolExecutor",
    "ToolResult",
    "Toolkit",
    "format_tool_output",
    "function_schema",
    "validate",
]
