"""Shrinking text to a token budget without losing what the reader is looking for.

Tool outputs and findings are summarised *extractively*: whole lines are kept, the lines that
mention the sub-question's terms first, in their original order, and a marker says how much
was left out. No model call is spent on it, and nothing is invented.
"""

from __future__ import annotations

from dataclasses import dataclass

from research import tokens
from research.tools.corpus import STOP_WORDS, terms


@dataclass(frozen=True)
class Summary:
    text: str
    original_tokens: int
    tokens: int
    kept_lines: int
    total_lines: int

    @property
    def shortened(self) -> bool:
        return self.kept_lines < self.total_lines or self.tokens < self.original_tokens


def focus_terms(text: str) -> set[str]:
    return {t for t in terms(text) if t not in STOP_WORDS}


def summarize_text(text: str, focus: str, budget: int) -> Summary:
    """`text` cut to `budget` tokens, keeping headings and the lines most relevant to `focus`."""
    original = tokens.count_text(text)
    lines = text.splitlines()
    if original <= budget:
        non_empty = sum(1 for line in lines if line.strip())
        return Summary(text, original, original, non_empty, non_empty)
    wanted = focus_terms(focus)
    marker_cost = 16

    def relevance(item: tuple[int, str]) -> tuple[int, int, int]:
        index, line = item
        hits = len(wanted & set(terms(line)))
        heading = 1 if line.lstrip().startswith("#") else 0
        return (-hits, -heading, index)

    chosen: set[int] = set()
    used = marker_cost
    for index, line in sorted(enumerate(lines), key=relevance):
        cost = tokens.count_text(line)
        if not line.strip() or used + cost > budget:
            continue
        chosen.add(index)
        used += cost
    kept = [line for i, line in enumerate(lines) if i in chosen]
    non_empty = sum(1 for line in lines if line.strip())
    kept.append(f"[summarised to the lines most relevant to the question: kept {len(kept)} of "
                f"{non_empty} non-empty lines]")
    result = "\n".join(kept)
    return Summary(result, original, tokens.count_text(result), len(chosen), non_empty)
