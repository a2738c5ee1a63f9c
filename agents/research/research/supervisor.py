"""The supervisor: hands sub-questions to parallel researchers and collects their findings.

Each round is a barrier: every researcher of the round finishes (or is timed out) before the
round's findings are read. Researchers are numbered across rounds in plan order, and their
spans are opened here, before any of them starts, so conversation keys and trace order do not
depend on scheduling. A researcher that crashes is restarted once with a fresh conversation
state; one that times out or fails again leaves a failed finding instead of stopping the run.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from research import roles
from research.config import Limits
from research.context import ContextOverflow
from research.events import EventBus
from research.findings import Finding, FindingsStore
from research.llm.client import LLMClient, LLMError
from research.planner import SubQuestion
from research.researcher import Researcher
from research.tools.registry import ToolRegistry
from research.tracing import Span, Tracer


@dataclass
class Assignment:
    index: int
    subquestion: SubQuestion
    span: Span


class Supervisor:
    def __init__(self, client: LLMClient, registry: ToolRegistry, store: FindingsStore,
                 tracer: Tracer, bus: EventBus, limits: Limits, question: str):
        self.client = client
        self.registry = registry
        self.store = store
        self.tracer = tracer
        self.bus = bus
        self.limits = limits
        self.question = question
        self.next_index = 0
        self.restarts = 0

    async def run_round(self, round_no: int, subquestions: list[SubQuestion]) -> list[Finding]:
        with self.tracer.span("supervisor.round", "chain", {
            "pathfinder.round": round_no,
            "pathfinder.researchers": len(subquestions),
            "input.value": [sq.text for sq in subquestions],
        }) as round_span:
            assignments = []
            for subquestion in subquestions:
                index = self.next_index
                self.next_index += 1
                span = self.tracer.span("researcher.run", "agent", {
                    "gen_ai.agent.name": roles.researcher_key(index),
                    "gen_ai.operation.name": "invoke_agent",
                    "pathfinder.step_index": 0,
                }, code=Researcher.run)
                assignments.append(Assignment(index, subquestion, span))
            await self.bus.emit("round.started", round=round_no, researchers=len(assignments))
            gate = asyncio.Semaphore(self.limits.max_parallel)
            await asyncio.gather(*(self._supervise(a, round_no, gate) for a in assignments))
            findings = self.store.for_round(round_no)
            failed = [f for f in findings if not f.usable]
            round_span.set({"output.value": [f.brief() for f in findings],
                            "pathfinder.findings": len(findings),
                            "pathfinder.failed_findings": len(failed)})
            await self.bus.emit("round.finished", round=round_no, findings=len(findings))
            return findings

    async def _supervise(self, assignment: Assignment, round_no: int,
                         gate: asyncio.Semaphore) -> None:
        async with gate:
            finding = None
            for attempt in (1, 2):
                researcher = Researcher(
                    assignment.index, round_no, assignment.subquestion, self.question, self.store,
                    self.client, self.registry, self.tracer, self.bus, self.limits,
                )
                span = assignment.span if attempt == 1 else self._restart_span(assignment)
                try:
                    finding = await asyncio.wait_for(researcher.run(span),
                                                     timeout=self.limits.researcher_timeout_s)
                    break
                except asyncio.TimeoutError:
                    finding = self._lost(assignment, round_no, "timeout",
                                         f"no finding within {self.limits.researcher_timeout_s}s",
                                         researcher.steps)
                    break
                except (LLMError, ContextOverflow, OSError, ValueError) as exc:
                    finding = self._lost(assignment, round_no, "failed",
                                         f"{type(exc).__name__}: {exc}", researcher.steps)
                    if attempt == 1:
                        self.restarts += 1
                        await self.bus.emit("researcher.restarted", researcher=assignment.index)
            assert finding is not None
            await self.store.add(finding)
            await self.bus.emit("researcher.finished", researcher=assignment.index,
                                status=finding.status)

    def _restart_span(self, assignment: Assignment) -> Span:
        return self.tracer.span("researcher.run", "agent", {
            "gen_ai.agent.name": roles.researcher_key(assignment.index),
            "gen_ai.operation.name": "invoke_agent",
            "pathfinder.restart": True,
            "pathfinder.step_index": 0,
        }, code=Researcher.run, parent=assignment.span.parent)

    @staticmethod
    def _lost(assignment: Assignment, round_no: int, status: str, error: str,
              steps: int) -> Finding:
        return Finding(
            researcher=assignment.index, round=round_no,
            question_id=assignment.subquestion.id, question=assignment.subquestion.text,
            answer="", evidence="", confidence="none", status=status, error=error, steps=steps,
        )
