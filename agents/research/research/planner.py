"""The planner: decomposes the question into report sections and sub-questions.

The plan comes back as JSON (structured output, possibly wrapped in markdown by the model).
Sub-questions are numbered in plan order, which fixes which researcher (and so which
conversation key) handles each one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from research import prompts, roles
from research.config import Limits
from research.jsonextract import JSONExtractError, extract_json
from research.llm.client import LLMClient
from research.textnorm import nfc
from research.tracing import Tracer, agent_scope


class PlanError(ValueError):
    """The model's plan is not usable; the message says what is wrong with it."""


@dataclass(frozen=True)
class SubQuestion:
    id: str
    section: str
    text: str


@dataclass(frozen=True)
class Plan:
    question: str
    sections: tuple[str, ...]
    subquestions: tuple[SubQuestion, ...]
    combine: str
    fallback: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"sections": list(self.sections), "combine": self.combine,
                "fallback": self.fallback,
                "subquestions": [sq.__dict__ for sq in self.subquestions]}


def plan_schema() -> dict[str, Any]:
    """The response_format schema for plans."""
    return {
        "type": "object",
        "properties": {
            "sections": {"type": "array", "items": {"$ref": "#/$defs/section"}},
            "combine": {"type": "string"},
        },
        "required": ["sections"],
        "$defs": {
            "section": {
                "type": "object",
                "properties": {
                    "title": {"type": "string"},
                    "questions": {"type": "array", "items": {"type": "string"}},
                },
                "required": ["title", "questions"],
            }
        },
    }


def parse_plan(question: str, data: dict[str, Any], limits: Limits) -> Plan:
    sections = data.get("sections")
    if not isinstance(sections, list) or not sections:
        raise PlanError("'sections' must be a non-empty list")
    if len(sections) > limits.max_sections:
        raise PlanError(f"{len(sections)} sections; at most {limits.max_sections} are allowed")
    titles: list[str] = []
    subquestions: list[SubQuestion] = []
    for s_index, section in enumerate(sections, 1):
        if not isinstance(section, dict):
            raise PlanError(f"section {s_index} is not an object")
        title = nfc(str(section.get("title") or f"Section {s_index}")).strip()
        questions = section.get("questions")
        if isinstance(questions, str):
            questions = [questions]
        if not isinstance(questions, list) or not questions:
            raise PlanError(f"section {s_index} ({title!r}) has no questions")
        if len(questions) > limits.max_questions:
            raise PlanError(f"section {s_index} has {len(questions)} questions; at most "
                            f"{limits.max_questions} are allowed")
        titles.append(title)
        for q_index, text in enumerate(questions, 1):
            if isinstance(text, dict):
                text = text.get("question") or text.get("text") or ""
            text = nfc(str(text)).strip()
            if not text:
                raise PlanError(f"section {s_index} question {q_index} is empty")
            subquestions.append(SubQuestion(f"s{s_index}q{q_index}", title, text))
    combine = nfc(str(data.get("combine") or "Answer the question from the findings.")).strip()
    return Plan(question, tuple(titles), tuple(subquestions), combine)


class Planner:
    def __init__(self, client: LLMClient, tracer: Tracer, limits: Limits):
        self.client = client
        self.tracer = tracer
        self.limits = limits

    async def plan(self, question: str) -> Plan:
        with agent_scope(roles.PLANNER.name), \
                self.tracer.span("planner.plan", "chain", {"input.value": question}) as span:
            system = prompts.system_prompt(roles.PLANNER.name,
                                           max_sections=self.limits.max_sections,
                                           max_questions=self.limits.max_questions)
            messages = [
                {"role": "system", "content": system},
                {"role": "user", "content": prompts.render(prompts.PLANNER_USER,
                                                           question=question)},
            ]
            response_format = {"type": "json_schema",
                               "json_schema": {"name": "research_plan", "schema": plan_schema()}}
            problem = ""
            for attempt in range(2):
                result = await self.client.chat(roles.PLANNER, roles.PLANNER.conversation(),
                                                messages, response_format=response_format)
                try:
                    plan = parse_plan(question, extract_json(result.content), self.limits)
                    span.set({"output.value": plan.to_json(),
                              "pathfinder.plan.subquestions": len(plan.subquestions),
                              "pathfinder.plan.attempts": attempt + 1})
                    return plan
                except (JSONExtractError, PlanError) as exc:
                    problem = str(exc)
                    messages.append(result.as_message())
                    messages.append({"role": "user", "content": prompts.render(
                        prompts.PLANNER_RETRY, problem=problem)})
            # Fallback: research the question as a whole rather than give up.
            plan = Plan(question, ("Answer",), (SubQuestion("s1q1", "Answer", question),),
                        "Answer the question from the finding.", fallback=True)
            span.error(f"planner output unusable, researching the question whole: {problem}",
                       "PlanError")
            span.set({"output.value": plan.to_json(), "pathfinder.plan.fallback": True})
            return plan
