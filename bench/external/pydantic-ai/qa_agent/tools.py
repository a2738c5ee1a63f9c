"""The agent's tools over a folder of documents and CSV tables.

`search` and `read_file` are plain functions whose signatures and docstrings Pydantic AI turns
into tool schemas; `table_lookup` carries a hand-written JSON schema (its conditions are nested
objects), as many applications do for tools with structured arguments.
"""

from __future__ import annotations

import ast
import csv
import operator
import os
import re
import unicodedata
from pathlib import Path
from typing import Any

from pydantic_ai import ModelRetry, Tool

_WORD = re.compile(r"\w+")
_STOPWORDS = frozenset(
    "a an and are as at be by did do does for from has have how in is it its of on or the "
    "to was were what when where which who whom whose why with".split()
)


def corpus_root() -> Path:
    """The documents' folder, from `QA_CORPUS`."""
    return Path(os.environ["QA_CORPUS"]).resolve()


def fold(text: str) -> str:
    """Lower case without diacritics, so that 'Zoë' typed either way matches."""
    decomposed = unicodedata.normalize("NFKD", text)
    return "".join(c for c in decomposed if not unicodedata.combining(c)).lower()


def _terms(text: str) -> list[str]:
    return [t for t in _WORD.findall(fold(text)) if t not in _STOPWORDS]


def _documents(collection: str | None) -> list[tuple[str, str]]:
    root = corpus_root()
    base = root / collection if collection else root
    docs = []
    for path in sorted(base.rglob("*.md")):
        text = path.read_text(encoding="utf-8", errors="replace")
        docs.append((path.relative_to(root).as_posix(), text))
    return docs


def search(query: str, top_k: int | None = 3, collection: str | None = None) -> str:
    """Search the document corpus.

    Returns the best matching documents, each with its path (for read_file), its title and
    the line that matches the query best.

    Args:
        query: Keywords to look for.
        top_k: How many documents to return (default 3).
        collection: Only search this folder of the corpus, e.g. 'lumen'.
    """
    wanted = set(_terms(query))
    if not wanted:
        raise ModelRetry("the query has no words to search for")
    scored = []
    for rel, text in _documents(collection):
        words = _terms(text)
        hits = sum(1 for w in words if w in wanted)
        covered = len(wanted & set(words))
        if covered:
            scored.append((covered, hits, rel, text))
    scored.sort(key=lambda s: (-s[0], -s[1], s[2]))
    if not scored:
        return f"no documents match {query!r}"
    lines = []
    for _, _, rel, text in scored[: top_k or 3]:
        title = next((l.lstrip("#").strip() for l in text.splitlines() if l.startswith("#")), rel)
        best = max(
            (l.strip() for l in text.splitlines() if l.strip()),
            key=lambda l: len(wanted & set(_terms(l))),
        )
        lines.append(f"{rel} | {title} | {best[:200]}")
    return "\n".join(lines)


def read_file(path: str, start_line: int = 1, max_lines: int | None = None) -> str:
    """Read a document of the corpus by its path (e.g. 'harrowmere/lighthouse.md').

    Args:
        path: Path relative to the corpus root.
        start_line: First line to return (1-based).
        max_lines: How many lines to return; up to 200 when absent.
    """
    root = corpus_root()
    target = (root / path).resolve()
    if root not in target.parents or not target.is_file():
        raise ModelRetry(f"no such file {path!r}; search first to find a document's path")
    # Some documents were written in Latin-1; a stray byte must not end the run.
    lines = target.read_text(encoding="utf-8", errors="replace").splitlines()
    if start_line > max(len(lines), 1):
        raise ModelRetry(f"{path} has only {len(lines)} lines")
    chosen = lines[start_line - 1 : start_line - 1 + (max_lines or 200)]
    header = f"# {path} (lines {start_line}-{start_line - 1 + len(chosen)} of {len(lines)})"
    return "\n".join([header, *chosen])


_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
    ast.Mod: operator.mod,
}


_FUNCTIONS = {"round": lambda x, n=0: round(x, int(n)), "abs": abs, "min": min, "max": max}


def _evaluate(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return float(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _evaluate(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return _BINARY[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS:
        if node.keywords:
            raise ValueError(f"{node.func.id}() takes no keyword arguments")
        return float(_FUNCTIONS[node.func.id](*(_evaluate(a) for a in node.args)))
    raise ValueError(f"unsupported expression element {ast.dump(node)[:60]}")


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression such as '(3120 + 4480) * 1.5'.

    Args:
        expression: Numbers with + - * / % ** and parentheses.
    """
    try:
        # Thousands separators ("12,400") go; commas between arguments stay.
        plain = re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", expression)
        value = _evaluate(ast.parse(plain, mode="eval"))
    except (SyntaxError, ValueError, TypeError, ZeroDivisionError) as err:
        raise ModelRetry(f"cannot evaluate {expression!r}: {err}") from None
    return str(int(value)) if value == int(value) else f"{value:.6g}"


_OPS = {
    "=": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}

TABLE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "table": {"type": "string", "description": "Table name, e.g. 'population'."},
        "where": {
            "type": "array",
            "items": {"$ref": "#/$defs/condition"},
            "description": "Conditions every returned row must meet.",
        },
        "columns": {
            "type": "array",
            "items": {"type": "string"},
            "description": "Columns to return (default: all).",
        },
        "order_by": {"type": ["string", "null"], "description": "Column to sort by."},
        "descending": {"type": "boolean"},
        "limit": {"type": ["integer", "null"], "minimum": 1},
    },
    "required": ["table"],
    "additionalProperties": False,
    "$defs": {
        "condition": {
            "type": "object",
            "properties": {
                "column": {"type": "string"},
                "op": {"type": "string", "enum": [*_OPS, "contains"]},
                "value": {"type": ["string", "number"]},
            },
            "required": ["column", "op", "value"],
        }
    },
}


def _cell(text: str) -> Any:
    try:
        return float(text)
    except ValueError:
        return text


def _key(value: Any) -> Any:
    """Text compared without case or spaces; numbers as numbers."""
    return re.sub(r"\s+", "", fold(value)) if isinstance(value, str) else float(value)


def _matches(row: dict[str, Any], cond: dict[str, Any]) -> bool:
    if cond["column"] not in row:
        raise ModelRetry(f"no column {cond['column']!r}; the table has {', '.join(row)}")
    have, want, op = row[cond["column"]], cond["value"], cond["op"]
    if op == "contains":
        return fold(str(want)) in fold(str(have))
    if op not in _OPS:
        raise ModelRetry(f"unknown operator {op!r}")
    if isinstance(have, str) != isinstance(want, str):
        have, want = str(have), str(want)
    return _OPS[op](_key(have), _key(want))


def table_lookup(
    table: str,
    where: list[dict[str, Any]] | None = None,
    columns: list[str] | None = None,
    order_by: str | None = None,
    descending: bool = False,
    limit: int | None = None,
) -> str:
    """Rows of a CSV table of the corpus, filtered, projected and sorted."""
    path = corpus_root() / "tables" / f"{table}.csv"
    if not path.is_file():
        names = sorted(p.stem for p in path.parent.glob("*.csv"))
        raise ModelRetry(f"no table {table!r}; the tables are {', '.join(names)}")
    with path.open(encoding="utf-8", newline="") as handle:
        rows = [{k: _cell(v) for k, v in row.items()} for row in csv.DictReader(handle)]
    rows = [r for r in rows if all(_matches(r, c) for c in where or [])]
    if order_by:
        rows.sort(key=lambda r: _key(r[order_by]), reverse=descending)
    if limit:
        rows = rows[:limit]
    keep = columns or (list(rows[0]) if rows else [])
    if not rows:
        return "no rows match"
    out = [",".join(keep)]
    for row in rows:
        out.append(",".join(str(row[c]) for c in keep))
    return "\n".join(out)


def all_tools() -> list[Tool]:
    """The tools, by the names the task files use."""
    return [
        Tool(search, takes_ctx=False),
        Tool(read_file, takes_ctx=False),
        Tool(calculator, takes_ctx=False),
        Tool.from_schema(
            table_lookup,
            name="table_lookup",
            description="Look up rows of a CSV table of the corpus (population, products, "
            "sales_2023, rainfall, burns, bakery_prices).",
            json_schema=TABLE_SCHEMA,
        ),
    ]
