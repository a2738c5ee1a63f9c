"""A sub-researcher: answers one sub-question with the tools, in its own conversation.

Its loop ends when the model replies without a tool call (the finding), when the step budget
is spent or the model repeats the same call without progress (then it is asked for its finding
with tools switched off), or when its reply cannot be read as a finding twice in a row.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

from research import prompts, roles
from research.config import Limits
from research.context import FitReport, fit_messages
from research.events import EventBus
from research.findings import CONFIDENCE_RANK, Finding, FindingsStore
from research.jsonextract import JSONExtractError, extract_json
from research.llm.client import ChatResult, ContextOverflowError, LLMClient
from research.planner import SubQuestion
from research.textnorm import nfc
from research.tools.calculator import format_number
from research.tools.registry import ToolRegistry
from research.tracing import Span, Tracer, agent_scope, set_step


class FindingFormatError(ValueError):
    """The researcher's final reply is not a usable finding."""


def parse_finding(content: str | None) -> dict[str, Any]:
    data = extract_json(content)
    answer = data.get("answer", "")
    if isinstance(answer, bool) or answer is None:
        raise FindingFormatError("'answer' must be a string or a number")
    if isinstance(answer, (int, float)):
        answer = format_number(answer)
    if not isinstance(answer, str):
        raise FindingFormatError(
            f"'answer' must be a string or a number, got {type(answer).__name__}")
    sources = data.get("sources") or []
    if isinstance(sources, str):
        sources = [sources]
    if not isinstance(sources, list):
        raise FindingFormatError("'sources' must be a list of paths or table names")
    confidence = str(data.get("confidence") or "medium").strip().lower()
    if confidence not in CONFIDENCE_RANK:
        confidence = "medium"
    return {
        "answer": nfc(answer).strip(),
        "evidence": nfc(str(data.get("evidence") or "")).strip(),
        "sources": tuple(nfc(str(s)).strip() for s in sources if str(s).strip()),
        "confidence": confidence,
    }


class Researcher:
    def __init__(
        self,
        index: int,
        round_no: int,
        subquestion: SubQuestion,
        overall_question: str,
        store: FindingsStore,
        client: LLMClient,
        registry: ToolRegistry,
        tracer: Tracer,
        bus: EventBus,
        limits: Limits,
    ):
        self.index = index
        self.round_no = round_no
        self.subquestion = subquestion
        self.overall = overall_question
        self.store = store
        self.known: list[Finding] = []
        self.client = client
        self.registry = registry
        self.tracer = tracer
        self.bus = bus
        self.limits = limits
        self.key = roles.researcher_key(index)
        self.messages: list[dict[str, Any]] = []
        self.steps = 0

    def recall(self) -> list[Finding]:
        """Findings of earlier rounds relevant to this sub-question (a fixed snapshot)."""
        with self.tracer.span("memory.retrieve", "retriever", {
            "input.value": self.subquestion.text,
            "pathfinder.round": self.round_no,
        }) as span:
            found = self.store.retrieve(self.subquestion.text, before_round=self.round_no)
            span.set({"output.value": [f.brief() for f in found],
                      "pathfinder.retrieved": len(found)})
            return found

    def initial_messages(self) -> list[dict[str, Any]]:
        known = ""
        if self.known:
            known = prompts.render(prompts.RESEARCHER_KNOWN,
                                   findings="\n".join(f"- {f.brief()}" for f in self.known))
        return [
            {"role": "system",
             "content": prompts.system_prompt(roles.RESEARCHER.name, index=self.index)},
            {"role": "user", "content": prompts.render(
                prompts.RESEARCHER_USER, question=self.subquestion.text,
                section=self.subquestion.section, overall=self.overall, known=known)},
        ]

    async def run(self, span: Span) -> Finding:
        """Researches inside `span` (opened by the supervisor) and returns the finding."""
        with agent_scope(self.key), span:
            self.known = self.recall()
            span.set({"input.value": self.subquestion.text,
                      "pathfinder.question_id": self.subquestion.id,
                      "pathfinder.round": self.round_no,
                      "pathfinder.known_findings": len(self.known)})
            finding = await self._research()
            span.set({"output.value": json.dumps(finding.to_json(), ensure_ascii=False),
                      "pathfinder.steps": finding.steps})
            if finding.status != "ok":
                span.error(finding.error or "no finding", "ResearchFailed")
            return finding

    async def _research(self) -> Finding:
        self.messages = self.initial_messages()
        tools = self.registry.specs()
        seen_calls: Counter[tuple[str, str]] = Counter()
        format_retries = 0
        while self.steps < self.limits.researcher_steps:
            result = await self._step(tools, "auto")
            if result.tool_calls:
                stuck = False
                for call in result.tool_calls:
                    signature = (call.name, _canonical_arguments(call.arguments))
                    seen_calls[signature] += 1
                    stuck = stuck or seen_calls[signature] > self.limits.repeat_limit
                    outcome = await asyncio.to_thread(self.registry.execute, call,
                                                      self.subquestion.text)
                    self.messages.append(outcome.as_message())
                    await self.bus.emit("tool.finished", researcher=self.index,
                                        tool=call.name, ok=outcome.ok)
                if stuck:
                    break
                continue
            try:
                if result.truncated:
                    raise FindingFormatError(
                        f"the reply was cut off at the {roles.RESEARCHER.max_tokens}-token limit; "
                        "keep the evidence short")
                return self._finding(parse_finding(result.content))
            except (JSONExtractError, FindingFormatError) as exc:
                format_retries += 1
                if format_retries > 1:
                    return self._failed("unreadable finding", str(exc))
                self.messages.append({"role": "user", "content": prompts.render(
                    prompts.RESEARCHER_RETRY, problem=str(exc))})
        # Out of steps or going in circles: ask for the finding with tools switched off.
        self.messages.append({"role": "user", "content": prompts.render(
            prompts.RESEARCHER_FINALISE, steps=self.steps)})
        result = await self._step(tools, "none")
        try:
            return self._finding(parse_finding(result.content))
        except (JSONExtractError, FindingFormatError) as exc:
            return self._failed("unreadable finding after the step limit", str(exc))

    async def _step(self, tools: list[dict[str, Any]], tool_choice: str) -> ChatResult:
        self.steps += 1
        set_step(self.steps)
        prompt = self._fitted(tools)
        try:
            result = await self.client.chat(roles.RESEARCHER, self.key, prompt, tools=tools,
                                            tool_choice=tool_choice)
        except ContextOverflowError:
            # Our count and the API's disagreed: trim to a smaller window and try once more.
            prompt = self._fitted(tools, shrink=512)
            result = await self.client.chat(roles.RESEARCHER, self.key, prompt, tools=tools,
                                            tool_choice=tool_choice)
        self.messages.append(result.as_message())
        await self.bus.emit("researcher.step", researcher=self.index, step=self.steps)
        return result

    def _fitted(self, tools: list[dict[str, Any]], shrink: int = 0) -> list[dict[str, Any]]:
        window = self.limits.context_window - shrink
        fitted, report = fit_messages(self.messages, window, roles.RESEARCHER.max_tokens, tools)
        if report.changed:
            self._trace_trim(report, window)
        return fitted

    def _trace_trim(self, report: FitReport, window: int) -> None:
        with self.tracer.span("context.trim", "chain", {
            "pathfinder.context.window": window,
            "pathfinder.context.tokens_before": report.tokens_before,
            "pathfinder.context.tokens_after": report.tokens_after,
            "pathfinder.context.dropped_messages": report.dropped_messages,
            "pathfinder.context.clipped_messages": report.clipped_messages,
        }, code=fit_messages):
            pass

    def _finding(self, data: dict[str, Any]) -> Finding:
        return Finding(
            researcher=self.index, round=self.round_no, question_id=self.subquestion.id,
            question=self.subquestion.text, steps=self.steps, **data,
        )

    def _failed(self, reason: str, detail: str) -> Finding:
        return Finding(
            researcher=self.index, round=self.round_no, question_id=self.subquestion.id,
            question=self.subquestion.text, answer="", evidence="", confidence="none",
            status="failed", error=f"{reason}: {detail}", steps=self.steps,
        )


def _canonical_arguments(raw: str) -> str:
    try:
        return json.dumps(json.loads(raw), sort_keys=True)
    except (json.JSONDecodeError, TypeError):
        return raw.strip()
