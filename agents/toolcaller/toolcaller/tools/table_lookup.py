"""table_lookup: filter, project, sort and aggregate the CSV tables of the corpus."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

from . import corpus
from .base import Tool, ToolContext, ToolError
from .calculator import format_number

_OPS = ["=", "!=", "<", "<=", ">", ">=", "contains"]


def _number(text: Any) -> float | None:
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return float(text)
    try:
        return float(str(text).replace(",", "").strip())
    except ValueError:
        return None


def matches(cell: str, op: str, value: Any) -> bool:
    if op == "contains":
        return corpus.fold(str(value)) in corpus.fold(cell)
    a, b = _number(cell), _number(value)
    if a is None or b is None:
        a, b = corpus.fold(cell.strip()), corpus.fold(str(value).strip())
    return {"=": a == b, "!=": a != b, "<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]


def load_table(corpus_dir: str, name: str) -> tuple[list[str], list[dict[str, str]]]:
    stem = Path(name.strip()).name
    if stem.endswith(".csv"):
        stem = stem[:-4]
    tables = Path(corpus_dir) / "tables"
    path = tables / f"{stem}.csv"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in tables.glob("*.csv")))
        raise ToolError(f"no table {name!r}; tables: {known}")
    reader = csv.DictReader(io.StringIO(corpus.read_text(path)))
    return list(reader.fieldnames or []), list(reader)


class TableLookup(Tool):
    name = "table_lookup"
    description = ("Query a CSV table of the corpus (population, products, sales_2023, burns, "
                   "rainfall, bakery_prices, ...): keep rows matching all `where` conditions, "
                   "choose columns, sort, or aggregate one column.")
    parameters = {
        "type": "object",
        "properties": {
            "table": {"type": "string", "description": "Table name, e.g. 'population'."},
            "where": {"type": "array", "items": {"$ref": "#/$defs/condition"},
                      "description": "Conditions every returned row must meet."},
            "columns": {"type": "array", "items": {"type": "string"},
                        "description": "Columns to return (default: all)."},
            "order_by": {"type": ["string", "null"], "description": "Column to sort by."},
            "descending": {"type": "boolean", "default": False},
            "limit": {"type": ["integer", "null"], "minimum": 1},
            "aggregate": {"$ref": "#/$defs/aggregate"},
        },
        "required": ["table"],
        "additionalProperties": False,
        "$defs": {
            "condition": {
                "type": "object",
                "properties": {
                    "column": {"type": "string"},
                    "op": {"type": "string", "enum": _OPS},
                    "value": {"anyOf": [{"type": "string"}, {"type": "number"}]},
                },
                "required": ["column", "op", "value"],
                "additionalProperties": False,
            },
            "aggregate": {
                "type": "object",
                "properties": {
                    "function": {"type": "string", "enum": ["sum", "count", "mean", "min", "max"]},
                    "column": {"type": "string"},
                },
                "required": ["function"],
                "additionalProperties": False,
            },
        },
    }

    def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        header, rows = load_table(ctx.corpus_dir, args["table"])

        def column(name: str) -> str:
            for h in header:
                if corpus.fold(h) == corpus.fold(name.strip()):
                    return h
            raise ToolError(f"table {args['table']!r} has no column {name!r}; columns: {', '.join(header)}")

        for cond in args.get("where") or []:
            col = column(cond["column"])
            rows = [r for r in rows if matches(r[col], cond["op"], cond["value"])]
        if args.get("order_by"):
            col = column(args["order_by"])
            rows.sort(key=lambda r: (_number(r[col]) is None, _number(r[col]) or 0, r[col]),
                      reverse=bool(args.get("descending")))
        if args.get("limit"):
            rows = rows[: args["limit"]]
        if args.get("aggregate"):
            agg = args["aggregate"]
            if agg["function"] == "count":
                return f"count = {len(rows)}"
            if "column" not in agg:
                raise ToolError(f"aggregate {agg['function']} needs a column")
            col = column(agg["column"])
            values = [_number(r[col]) for r in rows]
            if not values or any(v is None for v in values):
                raise ToolError(f"column {col!r} has no numbers to {agg['function']} in the selected rows")
            result = {"sum": sum, "mean": lambda v: sum(v) / len(v), "min": min, "max": max}[agg["function"]](values)
            return f"{agg['function']}({col}) = {format_number(result)} over {len(rows)} rows"
        columns = [column(c) for c in args.get("columns") or header]
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(columns)
        for r in rows:
            writer.writerow([r[c] for c in columns])
        return out.getvalue().rstrip("\n") + f"\n({len(rows)} rows)"
