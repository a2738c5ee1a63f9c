"""The tools of toolcaller: search, read_file, calculator and table_lookup over the corpus."""

from .base import Tool, ToolContext, ToolError, ToolExecutor, ToolRegistry
from .calculator import Calculator
from .read_file import ReadFile
from .search import Search
from .table_lookup import TableLookup


def default_registry() -> ToolRegistry:
    registry = ToolRegistry()
    for tool in (Search(), ReadFile(), Calculator(), TableLookup()):
        registry.register(tool)
    return registry


__all__ = ["Tool", "ToolContext", "ToolError", "ToolExecutor", "ToolRegistry", "default_registry"]
