"""The corpus tools: keyword search, file reading, table lookup and a calculator.

Their behaviour follows ``agents/tasks/README.md`` ("Tool semantics"); the signatures and
docstrings below are what the model sees (the schemas are derived from them).
"""

from __future__ import annotations

import ast
import csv
import io
import math
import operator
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal, Optional, Union

from ..textnorm import display, normalize, terms
from .schema import Range


class ToolError(Exception):
    """A tool could not do what was asked; the message goes back to the model."""


STOP_WORDS = frozenset(
    "a an and are as at by did do does for from how in is it many much of on or the to was were "
    "what when where which who with".split()
)
SNIPPET_CHARS = 200
_DECIMAL = re.compile(r"^[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?$")


@dataclass
class ColumnFilter:
    """Keep only rows whose column matches a value.

    Attributes:
        column: The column to compare, as named in the table's header.
        value: The value to compare with; text or a number.
    """

    column: str
    value: Union[str, float]


class CorpusToolkit:
    """Read-only tools over one corpus directory."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self._documents: list[tuple[str, str]] | None = None

    # ----- helpers -----------------------------------------------------------------------

    def documents(self) -> list[tuple[str, str]]:
        """(path, NFC text) of every Markdown document outside ``tables/``, cached."""
        if self._documents is None:
            docs = []
            for path in sorted(self.root.rglob("*.md")):
                rel = path.relative_to(self.root).as_posix()
                if rel.split("/")[0] == "tables":
                    continue
                docs.append((rel, display(path.read_bytes().decode("utf-8", errors="replace"))))
            self._documents = docs
        return self._documents

    def tables(self) -> list[str]:
        return sorted(p.stem for p in (self.root / "tables").glob("*.csv"))

    def _safe_path(self, path: str) -> Path:
        pure = PurePosixPath(path)
        if not path or "\\" in path or pure.is_absolute() or ".." in pure.parts:
            raise ToolError(f"refusing path {path!r}: give a relative path inside the corpus, without '..'")
        target = (self.root / pure).resolve()
        if self.root not in target.parents:
            raise ToolError(f"refusing path {path!r}: it resolves outside the corpus")
        if not target.is_file():
            raise ToolError(f"no such file: {path!r}")
        return target

    # ----- tools -------------------------------------------------------------------------

    def search(self, query: str, limit: Optional[Annotated[int, Range(1, 10)]] = None) -> list[dict[str, Any]]:
        """Keyword search over the corpus documents (tables are not searched).

        Returns the best matching documents, each with its path, a score (how many distinct
        query words it contains) and the line that matches best. Common words are ignored.

        Args:
            query: Keywords to look for, e.g. "lighthouse keeper 1871".
            limit: How many documents to return, 1 to 10 (default 5).
        """
        wanted = []
        for term in terms(query):
            if term not in STOP_WORDS and term not in wanted:
                wanted.append(term)
        if not wanted:
            return []
        hits = []
        for path, text in self.documents():
            doc_terms = terms(text)
            present = [t for t in wanted if t in doc_terms]
            if not present:
                continue
            occurrences = sum(doc_terms.count(t) for t in present)
            best_line, best_count = "", -1
            for line in text.splitlines():
                line_terms = set(terms(line))
                count = sum(1 for t in wanted if t in line_terms)
                if count > best_count:
                    best_line, best_count = line, count
            hits.append((-len(present), -occurrences, path.encode("utf-8"), path, display(best_line.strip())[:SNIPPET_CHARS]))
        hits.sort()
        count = 5 if limit is None else limit
        return [{"path": path, "score": -score, "snippet": snippet} for score, _, _, path, snippet in hits[:count]]

    def read_file(self, path: str) -> str:
        """Read one corpus file: a document (e.g. "harrowmere/history.md") or a table as CSV
        (e.g. "tables/population.csv").

        Args:
            path: The file's path relative to the corpus root, with '/' separators.
        """
        target = self._safe_path(path)
        return display(target.read_bytes().decode("utf-8", errors="replace"))

    def table_lookup(
        self,
        table: str,
        where: Optional[ColumnFilter] = None,
        match: Literal["exact", "contains"] = "exact",
        columns: Optional[list[str]] = None,
    ) -> list[dict[str, str]]:
        """Rows of a table, optionally filtered on one column and cut to some columns.

        Cells are returned as text. An "exact" match ignores case and accents' encoding and
        treats 64.5 and 64.50 as equal; "contains" matches part of the cell.

        Args:
            table: The table's name, e.g. "products" (a file tables/products.csv).
            where: Keep only rows matching this column filter.
            match: How the filter value is compared with the cell: "exact" or "contains".
            columns: Return only these columns, in this order.
        """
        if table not in self.tables():
            raise ToolError(f"unknown table {table!r}; available tables: {', '.join(self.tables())}")
        text = (self.root / "tables" / f"{table}.csv").read_bytes().decode("utf-8", errors="replace")
        reader = csv.DictReader(io.StringIO(display(text)))
        header = list(reader.fieldnames or [])
        if match not in ("exact", "contains"):
            raise ToolError(f"unknown match mode {match!r}; use 'exact' or 'contains'")
        if where is not None and where.column not in header:
            raise ToolError(f"unknown column {where.column!r} in {table}; columns: {', '.join(header)}")
        for column in columns or []:
            if column not in header:
                raise ToolError(f"unknown column {column!r} in {table}; columns: {', '.join(header)}")
        rows = []
        for row in reader:
            if where is not None and not self._cell_matches(row[where.column], where.value, match):
                continue
            keep = columns or header
            rows.append({column: row[column] for column in keep})
        return rows

    @staticmethod
    def _cell_matches(cell: str, value: Union[str, float], match: str) -> bool:
        wanted = normalize(_value_text(value).strip())
        have = normalize(cell.strip())
        if match == "contains":
            return wanted in have
        if have == wanted:
            return True
        if _DECIMAL.match(have) and _DECIMAL.match(wanted):
            try:
                return Decimal(have) == Decimal(wanted)
            except InvalidOperation:
                return False
        return False

    def calculator(self, expression: str) -> str:
        """Evaluate one arithmetic expression exactly as written.

        Supports numbers, + - * / // % **, parentheses and round(x[, n]), abs, min, max,
        sum (of its arguments) and sqrt. Example: "round(1234 * 0.175, 2)".

        Args:
            expression: The expression to evaluate.
        """
        try:
            tree = ast.parse(expression.strip(), mode="eval")
        except SyntaxError as exc:
            raise ToolError(f"cannot parse expression {expression!r}: {exc.msg}") from None
        try:
            value = _evaluate(tree.body)
            if isinstance(value, float) and (math.isinf(value) or math.isnan(value)):
                raise OverflowError
            if float(value).is_integer() and abs(value) < 1e15:
                return str(int(value))
            return format(value, ".12g")
        except ZeroDivisionError:
            raise ToolError("division by zero") from None
        except OverflowError:
            raise ToolError("numeric overflow") from None


def _value_text(value: Union[str, float]) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def _sqrt(x: float) -> float:
    if x < 0:
        raise ToolError("square root of a negative number")
    return math.sqrt(x)


def _round(x: float, n: int | None = None) -> float:
    if n is not None and (not float(n).is_integer()):
        raise ToolError("round() needs a whole number of digits")
    return round(x) if n is None else round(x, int(n))


_FUNCTIONS = {
    "round": (_round, 1, 2),
    "abs": (abs, 1, 1),
    "min": (min, 1, None),
    "max": (max, 1, None),
    "sum": (lambda *xs: sum(xs), 1, None),
    "sqrt": (_sqrt, 1, 1),
}


def _evaluate(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > 1024:
            raise OverflowError
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
        spec = _FUNCTIONS.get(node.func.id)
        if spec is None:
            raise ToolError(f"unknown function {node.func.id!r}; allowed: {', '.join(_FUNCTIONS)}")
        func, least, most = spec
        if len(node.args) < least or (most is not None and len(node.args) > most):
            raise ToolError(f"{node.func.id}() got {len(node.args)} arguments")
        return func(*(_evaluate(arg) for arg in node.args))
    raise ToolError(f"not allowed in an expression: {ast.unparse(node)!r}")
