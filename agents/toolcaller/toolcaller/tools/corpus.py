"""Read-only access to the document corpus (`PATHFINDER_CORPUS`)."""

from __future__ import annotations

import unicodedata
from pathlib import Path

from .base import ToolError


def resolve(corpus_dir: str, relative: str) -> Path:
    """`relative` inside the corpus; refuses paths that leave it."""
    root = Path(corpus_dir).resolve()
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
    """A corpus file as text. Bytes that are not UTF-8 become U+FFFD rather than failing."""
    return path.read_bytes().decode("utf-8", errors="replace")


def documents(corpus_dir: str) -> list[tuple[str, Path]]:
    """(relative path, path) of every text document, tables excluded, sorted."""
    root = Path(corpus_dir)
    out = []
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.suffix in (".md", ".txt") and "tables" not in path.relative_to(root).parts:
            out.append((path.relative_to(root).as_posix(), path))
    return out


def fold(text: str) -> str:
    """Lowercase without diacritics, for matching: 'Zoë' and 'zoe' are the same word."""
    decomposed = unicodedata.normalize("NFKD", text.casefold())
    return "".join(ch for ch in decomposed if not unicodedata.combining(ch))
