"""The corpus tools of the GAIA-like tasks, as plain functions a Pydantic AI agent registers.

Pydantic AI builds each tool's JSON schema from the function's signature and the description
and `Args:` section of its docstring (`pydantic_ai._function_schema`), validates the model's
arguments with pydantic before the call, and hands a `ModelRetry`'s message back to the model
as a retry prompt. A tool's refusal (`ToolError`) is such a retry. The tools read
`PATHFINDER_CORPUS` and never write.
"""


import ast
import csv
import io
import math
import operator
import os
import re
import unicodedata
from collections import Counter
from pathlib import Path
from typing import Any, Optional, Union

from pydantic_ai import ModelRetry


class ToolError(ModelRetry):
    """A tool's refusal, shown to the model."""


def corpus_dir() -> Path:
    return Path(os.environ.get("PATHFINDER_CORPUS", "corpus")).resolve()


def fold(text: str) -> str:
    """Lowercase without diacritics: 'Zoë' and 'zoe' match."""
    decomposed = unicodedata.normalize("NFKD", text.casefold())
    return "".join(ch for ch in decomposed if not unicodedata.combining(ch))


def resolve(relative: str) -> Path:
    root = corpus_dir()
    cleaned = unicodedata.normalize("NFC", relative.strip()).lstrip("/")
    if cleaned.startswith("corpus/"):
        cleaned = cleaned[len("corpus/"):]
    path = (root / cleaned).resolve()
    if path != root and root not in path.parents:
        raise ToolError(f"{relative!r} is outside the corpus")
    if not path.is_file():
        raise ToolError(f"no file {relative!r} in the corpus")
    return path


def read_text(path: Path) -> str:
    return path.read_bytes().decode("utf-8", errors="replace")


# --- search: BM25 over the documents ---------------------------------------------------------

_WORD = re.compile(r"\w+")
_STOPWORDS = frozenset(
    "a an and are as at be by did do does for from has have how in is it its of on or the "
    "to was were what when where which who whom whose why with".split())
_K1, _B = 1.2, 0.75
_INDEX: dict[str, "Index"] = {}


def terms(text: str) -> list[str]:
    return [t for t in _WORD.findall(fold(text)) if t not in _STOPWORDS]


class Index:
    def __init__(self, root: Path) -> None:
        self.docs: list[tuple[str, str, Counter]] = []
        for path in sorted(root.rglob("*")):
            rel = path.relative_to(root)
            if path.is_file() and path.suffix in (".md", ".txt") and "tables" not in rel.parts:
                text = read_text(path)
                self.docs.append((rel.as_posix(), text, Counter(terms(text))))
        self.avg_len = sum(sum(c.values()) for _, _, c in self.docs) / max(len(self.docs), 1)
        self.df: Counter = Counter()
        for _, _, counts in self.docs:
            self.df.update(counts.keys())

    def rank(self, query: str) -> list[tuple[float, str, str]]:
        wanted = terms(query)
        n = len(self.docs)
        scored = []
        for rel, text, counts in self.docs:
            length = sum(counts.values())
            score = 0.0
            for t in wanted:
                f = counts.get(t, 0)
                if f:
                    idf = math.log(1 + (n - self.df[t] + 0.5) / (self.df[t] + 0.5))
                    score += idf * f * (_K1 + 1) / (f + _K1 * (1 - _B + _B * length / self.avg_len))
            if score > 0:
                scored.append((score, rel, text))
        scored.sort(key=lambda s: (-s[0], s[1]))
        return scored


def _snippet(text: str, query: str, width: int = 240) -> str:
    wanted = set(terms(query))
    best, best_score = "", -1
    for line in text.splitlines():
        score = len(wanted & set(terms(line)))
        if score > best_score and line.strip():
            best, best_score = line.strip(), score
    return best if len(best) <= width else best[: width - 1] + "…"


def _title(text: str, fallback: str) -> str:
    for line in text.splitlines():
        if line.startswith("#"):
            return line.lstrip("#").strip()
    return fallback


def search(query: str, top_k: Optional[int] = None, collection: Optional[str] = None) -> str:
    """Search the document corpus. Returns the best matching documents with their path (for read_file), title and the most relevant line.

    Args:
        query: Keywords to look for.
        top_k: How many documents to return (default 3).
        collection: Only search this folder of the corpus, e.g. 'lumen'.
    """
    root = corpus_dir()
    index = _INDEX.get(str(root))
    if index is None:
        index = _INDEX[str(root)] = Index(root)
    ranked = index.rank(query)
    if collection:
        ranked = [r for r in ranked if r[1].startswith(collection.strip("/") + "/")]
    top = ranked[: top_k or 3]
    if not top:
        return f"No documents match {query!r}."
    return "\n".join(
        f"{i}. {rel} — {_title(text, rel)} (score {score:.2f})\n   {_snippet(text, query)}"
        for i, (score, rel, text) in enumerate(top, 1))


def read_file(path: str, start_line: int = 1, max_lines: Optional[int] = None) -> str:
    """Read a document of the corpus by its path. Optionally read only some lines.

    Args:
        path: Path relative to the corpus root, as returned by search, e.g. 'harrowmere/lighthouse.md'.
        start_line: First line to return (1-based).
        max_lines: How many lines to return; absent for up to 200.
    """
    lines = read_text(resolve(path)).splitlines()
    count = max_lines or 200
    if start_line < 1 or start_line > max(len(lines), 1):
        raise ToolError(f"{path} has only {len(lines)} lines")
    chosen = lines[start_line - 1:start_line - 1 + count]
    end = start_line - 1 + len(chosen)
    return "\n".join([f"# {path} (lines {start_line}-{end} of {len(lines)})", *chosen])


# --- calculator -------------------------------------------------------------------------------

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
           ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_FUNCTIONS = {"round": round, "abs": abs, "min": min, "max": max, "sqrt": math.sqrt,
              "floor": math.floor, "ceil": math.ceil, "sum": lambda *xs: sum(xs)}


def _eval(node: ast.AST) -> "float | int":
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > 100:
            raise ToolError("exponent too large")
        try:
            return _BINARY[type(node.op)](left, right)
        except ZeroDivisionError as exc:
            raise ToolError("division by zero") from exc
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in _FUNCTIONS and not node.keywords):
        return _FUNCTIONS[node.func.id](*[_eval(a) for a in node.args])
    raise ToolError(f"unsupported expression element: {ast.dump(node)[:60]}")


def format_number(value: "float | int") -> str:
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ToolError("the result is not a finite number")
        rounded = round(value, 10)
        return str(int(rounded)) if rounded.is_integer() else repr(rounded)
    return str(value)


def calculator(expression: Union[str, float]) -> str:
    """Evaluate an arithmetic expression: + - * / // % ** and parentheses, with round, abs, min, max, sum, sqrt, floor, ceil.

    Args:
        expression: For example '(3120 + 4480) * 1.5'.
    """
    text = str(expression).replace("^", "**").replace("×", "*").replace("÷", "/")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise ToolError(f"cannot parse {expression!r}: {exc.msg}") from exc
    return format_number(_eval(tree.body))


# --- table_lookup -----------------------------------------------------------------------------

def _number(text: Any) -> "float | None":
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return float(text)
    try:
        return float(str(text).replace(",", "").strip())
    except ValueError:
        return None


def _matches(cell: str, op: str, value: Any) -> bool:
    if op == "contains":
        return fold(str(value)) in fold(cell)
    a, b = _number(cell), _number(value)
    if a is None or b is None:
        a, b = fold(cell.strip()), fold(str(value).strip())
    return {"=": a == b, "!=": a != b, "<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]


def table_lookup(
    table: str,
    where: Optional[list[dict[str, Any]]] = None,
    columns: Optional[list[str]] = None,
    order_by: Optional[str] = None,
    descending: bool = False,
    limit: Optional[int] = None,
    aggregate: Optional[dict[str, str]] = None,
) -> str:
    """Query a CSV table of the corpus (population, products, sales_2023, burns, rainfall, bakery_prices, ...): keep rows matching all `where` conditions, choose columns, sort, or aggregate one column.

    Args:
        table: Table name, e.g. 'population'.
        where: Conditions every returned row must meet: objects with column, op (= != < <= > >= contains) and value.
        columns: Columns to return (default: all).
        order_by: Column to sort by.
        descending: Sort from the largest.
        limit: At most this many rows.
        aggregate: Aggregate one column: {"function": sum|count|mean|min|max, "column": ...}.
    """
    stem = Path(table.strip()).name
    stem = stem[:-4] if stem.endswith(".csv") else stem
    tables = corpus_dir() / "tables"
    path = tables / f"{stem}.csv"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in tables.glob("*.csv")))
        raise ToolError(f"no table {table!r}; tables: {known}")
    reader = csv.DictReader(io.StringIO(read_text(path)))
    header, rows = list(reader.fieldnames or []), list(reader)

    def column(name: str) -> str:
        for h in header:
            if fold(h) == fold(name.strip()):
                return h
        raise ToolError(f"table {table!r} has no column {name!r}; columns: {', '.join(header)}")

    for cond in where or []:
        if not {"column", "op", "value"} <= set(cond) or cond["op"] not in ("=", "!=", "<", "<=", ">", ">=", "contains"):
            raise ToolError(f"condition {cond!r} needs column, op (= != < <= > >= contains) and value")
        col = column(cond["column"])
        rows = [r for r in rows if _matches(r[col], cond["op"], cond["value"])]
    if order_by:
        col = column(order_by)
        rows.sort(key=lambda r: (_number(r[col]) is None, _number(r[col]) or 0, r[col]), reverse=descending)
    if limit:
        rows = rows[:limit]
    if aggregate:
        function = aggregate.get("function")
        if function == "count":
            return f"count = {len(rows)}"
        if function not in ("sum", "mean", "min", "max"):
            raise ToolError(f"unknown aggregate function {function!r}")
        if "column" not in aggregate:
            raise ToolError(f"aggregate {function} needs a column")
        col = column(aggregate["column"])
        values = [_number(r[col]) for r in rows]
        if not values or any(v is None for v in values):
            raise ToolError(f"column {col!r} has no numbers to {function} in the selected rows")
        result = {"sum": sum, "mean": lambda v: sum(v) / len(v), "min": min, "max": max}[function](values)
        return f"{function}({col}) = {format_number(result)} over {len(rows)} rows"
    chosen = [column(c) for c in columns or header]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(chosen)
    for r in rows:
        writer.writerow([r[c] for c in chosen])
    return out.getvalue().rstrip("\n") + f"\n({len(rows)} rows)"


TOOLS = {"search": search, "read_file": read_file, "calculator": calculator, "table_lookup": table_lookup}
