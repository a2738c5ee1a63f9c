"""The deep-research loop: plan, research in parallel, write, review, and maybe research again.

    plan ─► round 1: researchers ─► aggregate ─► write draft ─► review
                 ▲                                                 │ revise + follow-ups
                 └──────────── round n+1 (while rounds remain) ◄───┘

The loop stops when the reviewer accepts, when the last allowed round has been written (the
last draft is not reviewed: nothing could act on the review), when the run's token budget is
spent, or when the writer's or reviewer's model calls fail for good (then the run ends with the
draft it has, or falls back to the findings).
"""

from __future__ import annotations

from dataclasses import dataclass

from research import tokens
from research.aggregate import Aggregate, aggregate
from research.config import Settings
from research.events import EventBus, RunStatistics
from research.findings import FindingsStore
from research.llm.client import LLMClient, LLMError
from research.planner import Plan, Planner, SubQuestion
from research.reflection import Critic, Review
from research.supervisor import Supervisor
from research.tools.corpus import Corpus
from research.tools.registry import ToolRegistry
from research.tracing import Tracer
from research.writer import Draft, ReportWriter


@dataclass(frozen=True)
class Outcome:
    status: str            # completed | failed | gave_up
    answer: str
    steps: int
    rounds: int
    stop_reason: str
    report: str = ""


class DeepResearchAgent:
    def __init__(self, settings: Settings, tracer: Tracer, bus: EventBus | None = None):
        self.settings = settings
        self.limits = settings.limits
        self.tracer = tracer
        self.bus = bus or EventBus()
        self.stats = RunStatistics(self.bus)
        self.ledger = tokens.UsageLedger()
        self.client = LLMClient(settings, tracer, self.ledger, self.bus)
        self.registry = ToolRegistry(Corpus(settings.corpus), tracer, self.limits)
        self.store = FindingsStore(self.bus, capacity=self.limits.memory_capacity)
        self.planner = Planner(self.client, tracer, self.limits)
        self.writer = ReportWriter(self.client, tracer, self.limits)
        self.critic = Critic(self.client, tracer, self.limits)

    async def run(self, question: str) -> Outcome:
        plan = await self.planner.plan(question)
        await self.bus.emit("plan.ready", subquestions=len(plan.subquestions))
        supervisor = Supervisor(self.client, self.registry, self.store, self.tracer, self.bus,
                                self.limits, question)
        pending: list[SubQuestion] = list(plan.subquestions)
        draft: Draft | None = None
        review: Review | None = None
        agg: Aggregate | None = None
        stop_reason = "max_rounds"
        rounds = 0
        for round_no in range(1, self.limits.max_rounds + 1):
            rounds = round_no
            if pending:
                await supervisor.run_round(round_no, pending)
            agg = aggregate(self.store.snapshot())
            critique = review.critique() if review is not None else None
            try:
                draft = await self.writer.write(question, plan.combine, agg, round_no, critique)
            except LLMError:
                # Keep the previous draft (if any); the outcome falls back to the findings.
                stop_reason = "writer_failed"
                break
            if round_no == self.limits.max_rounds:
                stop_reason = "max_rounds"
                break
            if self.ledger.total >= self.limits.run_token_budget:
                stop_reason = "token_budget"
                break
            try:
                review = await self.critic.review(question, draft, agg)
            except LLMError:
                # Review improves a draft; without it the draft stands.
                stop_reason = "review_failed"
                break
            await self.bus.emit("review.done", round=round_no, verdict=review.verdict)
            if review.accepted:
                stop_reason = "accepted"
                break
            pending = self._follow_ups(plan, review, round_no + 1)
            pending = self._re_asked(plan, pending)
        return self._outcome(draft, agg, rounds, stop_reason)

    @staticmethod
    def _follow_ups(plan: Plan, review: Review, round_no: int) -> list[SubQuestion]:
        return [SubQuestion(f"r{round_no}q{i}", "Follow-up", text)
                for i, text in enumerate(review.follow_up, 1)]

    @staticmethod
    def _re_asked(plan: Plan, follow_ups: list[SubQuestion]) -> list[SubQuestion]:
        """A follow-up that re-asks a planned sub-question (a second source for a figure) is
        that sub-question again, under its id, so the aggregation compares the two answers
        instead of keeping both unseen."""
        planned = {" ".join(sq.text.casefold().split()): sq for sq in plan.subquestions}
        return [planned.get(" ".join(sq.text.casefold().split()), sq) for sq in follow_ups]

    def _outcome(self, draft: Draft | None, agg: Aggregate | None, rounds: int,
                 stop_reason: str) -> Outcome:
        steps = self.ledger.calls
        report = draft.report if draft else ""
        if draft is not None and draft.answer:
            return Outcome("completed", draft.answer, steps, rounds, stop_reason, report)
        # Fallback: the report has no answer line, but a single sub-question was answered.
        usable = [f for f in (agg.findings if agg else ()) if f.usable]
        if len(usable) == 1:
            return Outcome("completed", usable[0].answer, steps, rounds,
                           f"{stop_reason}; answer taken from the only finding", report)
        status = "gave_up" if stop_reason == "token_budget" else "failed"
        return Outcome(status, "", steps, rounds, f"{stop_reason}; no final answer", report)
