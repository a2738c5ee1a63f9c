"""The reviewer: critiques a draft against its findings and may ask for another round.

Its verdict is JSON. `revise` with follow-up sub-questions triggers a research round (while
rounds remain); `revise` without them asks the writer for a revision only. An unreadable verdict
counts as `accept`, because the draft already exists and review is an improvement, not a gate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from research import prompts, roles
from research.aggregate import Aggregate, compress_findings
from research.config import Limits
from research.jsonextract import JSONExtractError, extract_json
from research.llm.client import LLMClient
from research.textnorm import nfc
from research.tracing import Tracer, agent_scope
from research.writer import Draft

VERDICTS = ("accept", "revise")
MAX_FOLLOW_UPS = 3


@dataclass(frozen=True)
class Review:
    verdict: str
    issues: tuple[str, ...] = ()
    follow_up: tuple[str, ...] = ()
    readable: bool = True

    @property
    def accepted(self) -> bool:
        return self.verdict == "accept"

    def critique(self) -> str:
        return "; ".join(self.issues) or "revise the report"


def parse_review(data: dict[str, Any]) -> Review:
    verdict = str(data.get("verdict", "")).strip().lower()
    if verdict not in VERDICTS:
        raise ValueError(f"verdict {data.get('verdict')!r} is not one of {VERDICTS}")
    issues = data.get("issues") or []
    follow = data.get("follow_up") or []
    if isinstance(issues, str):
        issues = [issues]
    if isinstance(follow, str):
        follow = [follow]
    return Review(
        verdict,
        tuple(nfc(str(i)).strip() for i in issues if str(i).strip()),
        tuple(nfc(str(q)).strip() for q in follow if str(q).strip())[:MAX_FOLLOW_UPS],
    )


class Critic:
    def __init__(self, client: LLMClient, tracer: Tracer, limits: Limits):
        self.client = client
        self.tracer = tracer
        self.limits = limits
        self.messages: list[dict[str, Any]] = [
            {"role": "system", "content": prompts.system_prompt(roles.CRITIC.name)}
        ]
        self.turns = 0

    async def review(self, question: str, draft: Draft, agg: Aggregate) -> Review:
        self.turns += 1
        content = prompts.render(
            prompts.CRITIC_USER, question=question, round=draft.round,
            max_rounds=self.limits.max_rounds, draft=draft.report,
            findings=compress_findings(agg, self.limits.findings_tokens),
            conflicts=agg.conflicts_text())
        self.messages.append({"role": "user", "content": content})
        with agent_scope(roles.CRITIC.name, self.turns), \
                self.tracer.span("critic.review", "chain", {"pathfinder.round": draft.round,
                                                            "input.value": content}) as span:
            result = await self.client.chat(roles.CRITIC, roles.CRITIC.conversation(),
                                            list(self.messages),
                                            response_format={"type": "json_object"})
            self.messages.append(result.as_message())
            try:
                review = parse_review(extract_json(result.content))
            except (JSONExtractError, ValueError) as exc:
                review = Review("accept", (f"unreadable review: {exc}",), (), readable=False)
                span.error(f"unreadable review, accepting the draft: {exc}", type(exc).__name__)
            span.set({"output.value": {"verdict": review.verdict, "issues": list(review.issues),
                                       "follow_up": list(review.follow_up)},
                      "pathfinder.review.verdict": review.verdict})
            return review
