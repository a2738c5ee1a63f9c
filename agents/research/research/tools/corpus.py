"""The corpus tools: keyword search, file reading and table lookup over PATHFINDER_CORPUS.

Their behaviour is fixed by agents/tasks/README.md ("Tool semantics") so that every agent's
tools agree; only the presentation of results is this agent's own (see tools/registry.py).
"""

from __future__ import annotations

import csv
import io
import os
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path

from research.textnorm import decode_bytes, fold, nfc

STOP_WORDS = frozenset(
    "a an and are as at by did do does for from how in is it many much of on or the to was "
    "were what when where which who with".split()
)
TERM = re.compile(r"[^\W_]+")
SNIPPET_CHARS = 200


class ToolError(Exception):
    """A tool refused its input or failed; the message goes back to the model."""


@dataclass(frozen=True)
class SearchHit:
    path: str
    score: int
    occurrences: int
    snippet: str


def terms(text: str) -> list[str]:
    return TERM.findall(fold(text))


class Corpus:
    """Read-only view of the corpus directory; documents are loaded once and cached."""

    def __init__(self, root: str | os.PathLike[str]):
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            raise ToolError(f"corpus directory {str(root)!r} does not exist")
        self._documents: dict[str, str] | None = None

    # -- documents -------------------------------------------------------------------------

    def documents(self) -> dict[str, str]:
        """Relative path -> NFC text of every `*.md` outside tables/, sorted by path."""
        if self._documents is None:
            found: dict[str, str] = {}
            for path in sorted(self.root.rglob("*.md")):
                rel = path.relative_to(self.root).as_posix()
                if rel.startswith("tables/"):
                    continue
                found[rel] = nfc(decode_bytes(path.read_bytes()))
            self._documents = dict(sorted(found.items(), key=lambda kv: kv[0].encode()))
        return self._documents

    def search(self, query: str, limit: int = 5) -> list[SearchHit]:
        if not 1 <= limit <= 10:
            raise ToolError(f"limit must be between 1 and 10, got {limit}")
        wanted: list[str] = []
        for term in terms(query):
            if term not in STOP_WORDS and term not in wanted:
                wanted.append(term)
        if not wanted:
            return []
        hits: list[SearchHit] = []
        for path, text in self.documents().items():
            doc_terms = terms(text)
            present = {t for t in wanted if t in doc_terms}
            if not present:
                continue
            occurrences = sum(1 for t in doc_terms if t in present)
            hits.append(SearchHit(path, len(present), occurrences, self._snippet(text, wanted)))
        hits.sort(key=lambda h: (-h.score, -h.occurrences, h.path.encode()))
        return hits[:limit]

    @staticmethod
    def _snippet(text: str, wanted: list[str]) -> str:
        best_line, best_count = "", 0
        for line in text.splitlines():
            line_terms = set(terms(line))
            count = sum(1 for t in wanted if t in line_terms)
            if count > best_count:
                best_line, best_count = line, count
        snippet = nfc(best_line.strip())
        return snippet[:SNIPPET_CHARS]

    def resolve(self, rel: str) -> Path:
        """The file for a corpus-relative path; refuses anything that could leave the corpus."""
        if not rel or rel.startswith("/") or "\\" in rel or re.match(r"^[A-Za-z]:", rel):
            raise ToolError(f"path {rel!r} must be relative to the corpus, '/'-separated")
        if any(part == ".." for part in rel.split("/")):
            raise ToolError(f"path {rel!r} must not contain '..'")
        path = (self.root / rel).resolve()
        if self.root not in path.parents:
            raise ToolError(f"path {rel!r} resolves outside the corpus")
        if not path.is_file():
            raise ToolError(f"no such file in the corpus: {rel!r}")
        return path

    def read_file(self, rel: str) -> str:
        return nfc(decode_bytes(self.resolve(rel).read_bytes()))

    # -- tables ----------------------------------------------------------------------------

    def table_names(self) -> list[str]:
        tables = self.root / "tables"
        if not tables.is_dir():
            return []
        return sorted(p.stem for p in tables.glob("*.csv"))

    def read_table(self, name: str) -> tuple[list[str], list[dict[str, str]]]:
        names = self.table_names()
        if name not in names:
            raise ToolError(f"unknown table {name!r}; available tables: {', '.join(names)}")
        text = nfc(decode_bytes((self.root / "tables" / f"{name}.csv").read_bytes()))
        reader = csv.DictReader(io.StringIO(text))
        header = list(reader.fieldnames or [])
        return header, [dict(row) for row in reader]

    def table_lookup(
        self,
        table: str,
        column: str | None = None,
        value: str | int | float | None = None,
        match: str = "exact",
        columns: list[str] | None = None,
    ) -> list[dict[str, str]]:
        header, rows = self.read_table(table)
        if (column is None) != (value is None):
            raise ToolError("a filter needs both a column and a value")
        if match not in ("exact", "contains"):
            raise ToolError(f"unknown match mode {match!r}; use 'exact' or 'contains'")
        for name in ([column] if column is not None else []) + list(columns or []):
            if name not in header:
                raise ToolError(
                    f"table {table!r} has no column {name!r}; columns: {', '.join(header)}"
                )
        if column is not None:
            rows = [row for row in rows if _cell_matches(row.get(column) or "", value, match)]
        if columns:
            rows = [{name: row.get(name) or "" for name in columns} for row in rows]
        return rows


def _as_decimal(text: str) -> Decimal | None:
    try:
        return Decimal(text.strip())
    except InvalidOperation:
        return None


def _cell_matches(cell: str, value: str | int | float | None, match: str) -> bool:
    wanted = fold(str(value)).strip()
    have = fold(cell).strip()
    if match == "contains":
        return wanted in have
    if have == wanted:
        return True
    a, b = _as_decimal(have), _as_decimal(wanted)
    return a is not None and b is not None and a.is_finite() and b.is_finite() and a == b
