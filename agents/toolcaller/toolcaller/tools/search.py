"""search: ranked retrieval over the corpus documents (BM25 over words, diacritics folded)."""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Any

from . import corpus
from .base import Tool, ToolContext

_WORD = re.compile(r"\w+")
_STOPWORDS = frozenset(
    "a an and are as at be by did do does for from has have how in is it its of on or the "
    "to was were what when where which who whom whose why with".split())
K1, B = 1.2, 0.75


def terms(text: str) -> list[str]:
    return [t for t in _WORD.findall(corpus.fold(text)) if t not in _STOPWORDS]


class Index:
    """BM25 statistics of the documents, built once per corpus."""

    def __init__(self, corpus_dir: str) -> None:
        self.docs: list[tuple[str, str, Counter]] = []
        for rel, path in corpus.documents(corpus_dir):
            text = corpus.read_text(path)
            self.docs.append((rel, text, Counter(terms(text))))
        self.avg_len = sum(sum(c.values()) for _, _, c in self.docs) / max(len(self.docs), 1)
        self.df: Counter = Counter()
        for _, _, counts in self.docs:
            self.df.update(counts.keys())

    def rank(self, query: str) -> list[tuple[float, str, str]]:
        q = terms(query)
        n = len(self.docs)
        scored = []
        for rel, text, counts in self.docs:
            length = sum(counts.values())
            score = 0.0
            for t in q:
                f = counts.get(t, 0)
                if not f:
                    continue
                idf = math.log(1 + (n - self.df[t] + 0.5) / (self.df[t] + 0.5))
                score += idf * f * (K1 + 1) / (f + K1 * (1 - B + B * length / self.avg_len))
            if score > 0:
                scored.append((score, rel, text))
        scored.sort(key=lambda s: (-s[0], s[1]))
        return scored


def snippet(text: str, query: str, width: int = 240) -> str:
    """The line of `text` sharing most terms with `query`, cut to `width` characters."""
    wanted = set(terms(query))
    best, best_score = "", -1
    for line in text.splitlines():
        score = len(wanted & set(terms(line)))
        if score > best_score and line.strip():
            best, best_score = line.strip(), score
    return best if len(best) <= width else best[: width - 1] + "…"


def title(text: str, fallback: str) -> str:
    for line in text.splitlines():
        if line.startswith("#"):
            return line.lstrip("#").strip()
    return fallback


class Search(Tool):
    name = "search"
    description = ("Search the document corpus. Returns the best matching documents with their "
                   "path (for read_file), title and the most relevant line.")
    parameters = {
        "type": "object",
        "properties": {
            "query": {"type": "string", "minLength": 1, "description": "Keywords to look for."},
            "top_k": {"type": ["integer", "null"], "minimum": 1, "maximum": 10, "default": 3,
                      "description": "How many documents to return (default 3)."},
            "collection": {"type": ["string", "null"],
                           "description": "Only search this folder of the corpus, e.g. 'lumen'."},
        },
        "required": ["query"],
        "additionalProperties": False,
    }

    def __init__(self) -> None:
        self._indexes: dict[str, Index] = {}

    def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        with ctx.lock:
            index = self._indexes.get(ctx.corpus_dir)
            if index is None:
                index = self._indexes[ctx.corpus_dir] = Index(ctx.corpus_dir)
        ranked = index.rank(args["query"])
        collection = args.get("collection")
        if collection:
            ranked = [r for r in ranked if r[1].startswith(collection.strip("/") + "/")]
        top = ranked[: args.get("top_k") or 3]
        if not top:
            return f"No documents match {args['query']!r}."
        lines = []
        for i, (score, rel, text) in enumerate(top, 1):
            lines.append(f"{i}. {rel} — {title(text, rel)} (score {score:.2f})\n   {snippet(text, args['query'])}")
        return "\n".join(lines)
