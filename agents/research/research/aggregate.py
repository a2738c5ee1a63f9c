"""Merging the researchers' findings and resolving contradictions between them.

Findings are grouped by sub-question (a follow-up round may re-research one). When usable
findings for the same sub-question disagree, the resolution is explicit and recorded: the
higher confidence wins, then the later round (follow-ups are targeted), then the finding with
more sources; the losing answers are kept as a `Conflict` so the writer and the reviewer see
that there was one.
"""

from __future__ import annotations

from dataclasses import dataclass

from research import tokens
from research.findings import Finding
from research.textnorm import fold


@dataclass(frozen=True)
class Conflict:
    question_id: str
    question: str
    chosen: Finding
    rejected: tuple[Finding, ...]

    def describe(self) -> str:
        others = "; ".join(f"{f.answer!r} (researcher {f.researcher}, round {f.round}, "
                           f"confidence {f.confidence})" for f in self.rejected)
        return (f"[{self.question_id}] researchers disagree: kept {self.chosen.answer!r} "
                f"(researcher {self.chosen.researcher}, round {self.chosen.round}, confidence "
                f"{self.chosen.confidence}) over {others}")


@dataclass(frozen=True)
class Aggregate:
    findings: tuple[Finding, ...]       # one per sub-question: the chosen or the failed one
    conflicts: tuple[Conflict, ...]
    missing: tuple[Finding, ...]        # sub-questions with no usable finding

    def findings_text(self) -> str:
        return "\n".join(f"- {f.brief()}" for f in self.findings) or "- (no findings)"

    def conflicts_text(self) -> str:
        if not self.conflicts:
            return ""
        return "Conflicts between researchers:\n" + "\n".join(
            f"- {c.describe()}" for c in self.conflicts)


def _normalised_answer(answer: str) -> str:
    text = fold(answer).strip().rstrip(".")
    try:
        return repr(float(text.replace(",", "")))
    except ValueError:
        return " ".join(text.split())


def aggregate(findings: list[Finding]) -> Aggregate:
    by_question: dict[str, list[Finding]] = {}
    for finding in sorted(findings, key=Finding.sort_key):
        by_question.setdefault(finding.question_id, []).append(finding)
    chosen: list[Finding] = []
    conflicts: list[Conflict] = []
    missing: list[Finding] = []
    for question_id, group in by_question.items():
        usable = [f for f in group if f.usable]
        if not usable:
            missing.append(group[-1])
            chosen.append(group[-1])
            continue
        best = max(usable, key=lambda f: (f.rank, f.round, len(f.sources), -f.researcher))
        chosen.append(best)
        disagreeing = tuple(
            f for f in usable
            if f is not best and _normalised_answer(f.answer) != _normalised_answer(best.answer)
        )
        if disagreeing:
            conflicts.append(Conflict(question_id, best.question, best, disagreeing))
    return Aggregate(tuple(chosen), tuple(conflicts), tuple(missing))


def compress_findings(agg: Aggregate, budget: int) -> str:
    """The findings text within `budget` tokens: evidence is shortened before anything else."""
    text = agg.findings_text()
    if tokens.count_text(text) <= budget:
        return text
    lines = []
    for finding in agg.findings:
        if finding.usable:
            evidence = finding.evidence.split(". ")[0][:160]
            lines.append(f"- [{finding.question_id}] {finding.question} -> {finding.answer} "
                         f"(confidence {finding.confidence}; {', '.join(finding.sources[:2])}) "
                         f"Evidence: {evidence}")
        else:
            lines.append(f"- [{finding.question_id}] {finding.question} -> NOT FOUND")
    text = "\n".join(lines)
    while tokens.count_text(text) > budget and lines:
        lines = [line[: max(60, len(line) * 3 // 4)] for line in lines]
        text = "\n".join(lines)
        if all(len(line) <= 60 for line in lines):
            break
    return text
