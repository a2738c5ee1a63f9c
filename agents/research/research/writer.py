"""The report writer: turns the aggregated findings into a markdown report and a final answer.

Its conversation persists across rounds: a revision is a new turn after the previous draft,
so the writer sees what it wrote and what the reviewer asked for.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from research import prompts, roles
from research.aggregate import Aggregate, compress_findings
from research.config import Limits
from research.llm.client import LLMClient
from research.textnorm import nfc
from research.tracing import Tracer, agent_scope, set_step

_FINAL = re.compile(r"^[\s>*_#-]*final\s+answer\s*[:：]\s*(.+?)\s*$", re.IGNORECASE | re.MULTILINE)


class AnswerMissing(ValueError):
    """The report has no 'Final answer:' line."""


def extract_answer(report: str | None) -> str:
    """The value of the last 'Final answer:' line, without markdown emphasis or a final period."""
    matches = _FINAL.findall(report or "")
    if not matches:
        raise AnswerMissing("no 'Final answer:' line in the report")
    answer = matches[-1].strip().strip("*_`").strip()
    if answer.endswith("."):
        answer = answer[:-1]
    answer = answer.strip()
    if not answer:
        raise AnswerMissing("the 'Final answer:' line is empty")
    return nfc(answer)


@dataclass(frozen=True)
class Draft:
    report: str
    answer: str | None
    round: int


class ReportWriter:
    def __init__(self, client: LLMClient, tracer: Tracer, limits: Limits):
        self.client = client
        self.tracer = tracer
        self.limits = limits
        self.messages: list[dict[str, Any]] = [
            {"role": "system", "content": prompts.system_prompt(roles.WRITER.name)}
        ]
        self.turns = 0

    async def write(self, question: str, combine: str, agg: Aggregate, round_no: int,
                    critique: str | None = None) -> Draft:
        findings = compress_findings(agg, self.limits.findings_tokens)
        if critique is None or self.turns == 0:
            content = prompts.render(prompts.WRITER_USER, question=question, combine=combine,
                                     findings=findings, conflicts=agg.conflicts_text())
        else:
            content = prompts.render(prompts.WRITER_REVISE, critique=critique,
                                     findings=findings, conflicts=agg.conflicts_text())
        self.messages.append({"role": "user", "content": content})
        with agent_scope(roles.WRITER.name, self.turns + 1), \
                self.tracer.span("writer.write", "chain", {"pathfinder.round": round_no,
                                                           "input.value": content}) as span:
            report, answer = await self._turn()
            if answer is None:
                # One corrective turn before giving the report up as answerless.
                self.messages.append({"role": "user", "content": prompts.WRITER_RETRY})
                set_step(self.turns + 1)
                report, answer = await self._turn()
            span.set({"output.value": report, "pathfinder.answer": answer or ""})
            if answer is None:
                span.error("report has no final answer", "AnswerMissing")
            return Draft(report, answer, round_no)

    async def _turn(self) -> tuple[str, str | None]:
        self.turns += 1
        result = await self.client.chat(roles.WRITER, roles.WRITER.conversation(),
                                        list(self.messages))
        self.messages.append(result.as_message())
        report = nfc(result.content or "")
        try:
            return report, extract_answer(report)
        except AnswerMissing:
            return report, None
