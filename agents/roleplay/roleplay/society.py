"""The role-playing society: task specifier, AI user, AI assistant and critic.

The task specifier turns the question into a plan. The AI user then instructs the AI
assistant one step at a time; the assistant carries each instruction out with the corpus
tools. When the assistant gives a final answer, the critic (running as its own task and
woken through the shared board) checks it; the verdict goes back to the user, who ends the
conversation with the done token once an answer is accepted, or keeps instructing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass, field
from typing import Any

from .agents import ChatAgent, ChatAgentResponse
from .blackboard import Blackboard, Note
from .events import EventBus
from .jsonutil import JSONExtractionError, extract_json
from .messages import BaseMessage
from .models import ModelBackend, ModelError
from .messages import RoleType
from .prompts import BOARD_FACTS_NOTE, CRITIC_REVIEW_PROMPT, TASK_SPECIFY_PROMPT, USER_FIRST_INPUT, VERDICT_NOTE
from .roles import DONE_TOKEN, RoleCast, default_cast, role_prompt_templates
from .textnorm import collapse_whitespace
from .tokens import TokenCounter
from .toolkit import Toolkit, ToolResult
from .tracing import CURRENT_TURN, acting_as, current_span, traced

# Board keys are (turn, round, index); a turn's answer sorts after all of its tool rounds.
ANSWER_SLOT = 99

CRITIC_SCHEMA = {
    "type": "object",
    "properties": {
        "verdict": {"type": "string", "enum": ["accept", "revise"]},
        "reason": {"type": "string"},
    },
    "required": ["verdict", "reason"],
    "additionalProperties": False,
}


@dataclass
class SocietyConfig:
    chat_turn_limit: int = 10
    max_tool_rounds: int = 4
    max_revisions: int = 2
    context_limit: int = 8192 - 768 - 256
    verdict_timeout_s: float = 180.0
    board_facts: int = 3
    fact_chars: int = 240
    with_task_specify: bool = True
    with_critic: bool = True


@dataclass
class SocietyOutcome:
    status: str  # completed | gave_up | failed
    answer: str
    turns: int
    reason: str
    transcript: list[dict[str, Any]] = field(default_factory=list)


def is_task_done(message: BaseMessage) -> bool:
    return DONE_TOKEN in message.content


class RolePlaying:
    def __init__(self, task_prompt: str, model: ModelBackend, toolkit: Toolkit, config: SocietyConfig,
                 cast: RoleCast | None = None) -> None:
        self.task_prompt = task_prompt
        self.model = model
        self.toolkit = toolkit
        self.config = config
        self.cast = cast or default_cast()
        self.counter = TokenCounter()
        self.bus = EventBus()
        self.board = Blackboard(self.bus)
        self.templates = role_prompt_templates(self.cast)
        self.transcript: list[dict[str, Any]] = []
        self.bus.subscribe("note.posted", self._record_note)
        self.revisions = 0
        self.plan: dict[str, Any] = {}
        self.user_agent: ChatAgent | None = None
        self.assistant_agent: ChatAgent | None = None
        self.critic_agent: ChatAgent | None = None

    async def _record_note(self, note: Note) -> None:
        self.transcript.append({"key": list(note.key), "kind": note.kind, "author": note.author, "text": note.text, "source": note.source})

    # ----- planning ------------------------------------------------------------------------

    @traced("society.specify_task", "chain")
    async def specify_task(self) -> dict[str, Any]:
        """Ask the task specifier for a plan; fall back to the bare question if it fails."""
        fallback = {"specified_task": self.task_prompt, "subgoals": [], "answer_format": "the bare value"}
        if not self.config.with_task_specify:
            return fallback
        specifier = ChatAgent(
            self.cast.specifier,
            self.templates[RoleType.TASK_SPECIFIER].render(),
            self.model.with_config(stream=False, response_format={"type": "json_object"}, temperature=0.0),
            self.counter,
            self.config.context_limit,
        )
        prompt = TASK_SPECIFY_PROMPT.format(task=self.task_prompt, tool_names=", ".join(self.toolkit.names()),
                                            **self.cast.names()).render()
        span = current_span()
        with acting_as(self.cast.specifier.name, 0):
            response = await specifier.step(BaseMessage.make_user_message("society", prompt), 0)
        try:
            if response.msg is None:
                raise JSONExtractionError("the task specifier stopped without a reply")
            plan = extract_json(response.msg.content)
            if not isinstance(plan.get("specified_task"), str) or not isinstance(plan.get("subgoals", []), list):
                raise JSONExtractionError("the plan lacks specified_task or subgoals")
        except JSONExtractionError as exc:
            if span is not None:
                span.update({"pathfinder.fallback": "bare question as plan", "exception.message": str(exc)})
            return fallback
        plan.setdefault("answer_format", fallback["answer_format"])
        if span is not None:
            span.set("output.value", json.dumps(plan, ensure_ascii=False))
        return plan

    def build_agents(self, plan: dict[str, Any]) -> None:
        """Second pass of the role prompts (task and plan), then one agent per role."""
        task_text = plan.get("specified_task") or self.task_prompt
        plan_json = json.dumps(plan, ensure_ascii=False)
        fill = {"task": task_text, "plan": plan_json, "answer_format": plan.get("answer_format", "the bare value")}
        limit = self.config.context_limit
        self.user_agent = ChatAgent(self.cast.user, self.templates[RoleType.USER].format(**fill).render(),
                                    self.model, self.counter, limit)
        self.assistant_agent = ChatAgent(self.cast.assistant, self.templates[RoleType.ASSISTANT].format(**fill).render(),
                                         self.model, self.counter, limit, toolkit=self.toolkit,
                                         max_tool_rounds=self.config.max_tool_rounds)
        assert self.assistant_agent.executor is not None
        self.assistant_agent.executor.add_result_callback(self._post_fact)
        self.critic_agent = ChatAgent(
            self.cast.critic,
            self.templates[RoleType.CRITIC].format(**fill).render(),
            self.model.with_config(stream=False, temperature=0.0, response_format={
                "type": "json_schema", "json_schema": {"name": "critic_verdict", "schema": CRITIC_SCHEMA, "strict": True}}),
            self.counter,
            limit,
        )

    # ----- the conversation ---------------------------------------------------------------

    async def run(self) -> SocietyOutcome:
        critic_task: asyncio.Task[None] | None = None
        try:
            self.plan = await self.specify_task()
            await self.board.post(Note((0, 0, 0), "plan", self.cast.specifier.name, json.dumps(self.plan, ensure_ascii=False)))
            self.build_agents(self.plan)
            if self.config.with_critic:
                critic_task = asyncio.create_task(self.critic_loop(), name="critic")
            outcome = await self.converse()
        except ModelError as exc:
            outcome = SocietyOutcome("failed", self.aggregate_answer()[0], 0, f"model_error: {exc}")
        finally:
            if critic_task is not None:
                critic_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await critic_task
        outcome.transcript = self.transcript
        return outcome

    @traced("society.converse", "chain")
    async def converse(self) -> SocietyOutcome:
        assert self.user_agent is not None and self.assistant_agent is not None
        user_input = BaseMessage.make_assistant_message(self.cast.assistant.name, USER_FIRST_INPUT.render())
        for turn in range(1, self.config.chat_turn_limit + 1):
            CURRENT_TURN.set(turn)
            with acting_as(self.cast.user.name, turn):
                user_response = await self.user_agent.step(user_input, turn)
            stop = self.check_termination(user_response, turn)
            if stop is not None:
                return stop
            assert user_response.msg is not None
            instruction = user_response.msg
            if is_task_done(instruction):
                return self.finish_on_done(turn)
            with acting_as(self.cast.assistant.name, turn):
                assistant_response = await self.delegate(instruction, turn)
            stop = self.check_termination(assistant_response, turn)
            if stop is not None:
                return stop
            assert assistant_response.msg is not None
            feedback = await self.review_if_final(assistant_response.msg, turn)
            user_input = self.compose_user_input(assistant_response.msg, feedback)
        answer, _ = self.aggregate_answer()
        return SocietyOutcome("gave_up", answer, self.config.chat_turn_limit, "turn_limit")

    def check_termination(self, response: ChatAgentResponse, turn: int) -> SocietyOutcome | None:
        """Stop when an agent terminated itself (context, tool rounds) or returned nothing."""
        if response.terminated or response.msg is None:
            reasons = response.info.get("termination_reasons", ["no_reply"])
            answer, _ = self.aggregate_answer()
            return SocietyOutcome("failed", answer, turn, f"agent_terminated: {', '.join(reasons)}")
        if response.info.get("finish_reason") == "length" and not response.msg.content.strip():
            answer, _ = self.aggregate_answer()
            return SocietyOutcome("failed", answer, turn, "empty reply cut at max_tokens")
        return None

    def finish_on_done(self, turn: int) -> SocietyOutcome:
        answer, accepted = self.aggregate_answer()
        if accepted:
            return SocietyOutcome("completed", answer, turn, "task_done")
        return SocietyOutcome("gave_up", answer, turn, "task_done_without_accepted_answer")

    @traced("society.delegate", "chain", attributes=lambda self, instruction, turn: {"input.value": instruction.content})
    async def delegate(self, instruction: BaseMessage, turn: int) -> ChatAgentResponse:
        """Hand the user's instruction to the assistant and record it on the board."""
        assert self.assistant_agent is not None
        await self.board.post(Note((turn, 0, 0), "instruction", self.cast.user.name, instruction.content))
        handed = BaseMessage.make_user_message(self.cast.user.name, instruction.content, turn=turn)
        return await self.assistant_agent.step(handed, turn)

    async def _post_fact(self, result: ToolResult, index: int) -> None:
        """Tool results become facts on the shared board (committed in call order)."""
        if not result.ok or result.value in ([], ""):
            return
        assert self.assistant_agent is not None
        key = (CURRENT_TURN.get(), self.assistant_agent.round_index, index)
        args = json.dumps(result.arguments, ensure_ascii=False, sort_keys=True)
        text = collapse_whitespace(result.content)[: self.config.fact_chars]
        await self.board.post(Note(key, "fact", self.cast.assistant.name, text, f"{result.name}({args})"))

    # ----- answers, reflection and aggregation ---------------------------------------------

    @traced("society.review_if_final", "chain")
    async def review_if_final(self, reply: BaseMessage, turn: int) -> str:
        """If the reply is a final answer, post it and wait for the critic's verdict."""
        try:
            data = extract_json(reply.content)
        except JSONExtractionError:
            return ""
        if "final_answer" not in data:
            return ""
        answer = collapse_whitespace(str(data["final_answer"]))
        evidence = str(data.get("evidence", ""))
        key = (turn, ANSWER_SLOT, 0)
        if not self.config.with_critic:
            await self.board.post(Note(key, "answer", self.cast.assistant.name, answer, evidence, data={"accepted": True}))
            return ""
        verdict_future = self.board.wait_for("verdict", after=key)
        await self.board.post(Note(key, "answer", self.cast.assistant.name, answer, evidence))
        try:
            verdict = await asyncio.wait_for(verdict_future, self.config.verdict_timeout_s)
        except asyncio.TimeoutError:
            verdict_future.cancel()
            verdict = Note(key, "verdict", "society", "critic did not answer in time; accepting", data={"verdict": "accept", "fallback": True})
        data = verdict.data or {}
        if data.get("verdict") == "revise":
            self.revisions += 1
        span = current_span()
        if span is not None:
            span.update({"pathfinder.answer": answer, "pathfinder.verdict": data.get("verdict"), "pathfinder.revisions": self.revisions})
        return VERDICT_NOTE.format(critic_role=self.cast.critic.name, answer=json.dumps(answer, ensure_ascii=False),
                                   verdict=data.get("verdict", "accept"), reason=data.get("reason", verdict.text)).render()

    async def critic_loop(self) -> None:
        """Reviews every final answer posted to the board, one at a time."""
        last: tuple[int, int, int] | None = None
        while True:
            answer = await self.board.wait_for("answer", after=last)
            last = answer.key
            with acting_as(self.cast.critic.name, answer.key[0]):
                verdict = await self.review(answer)
            await self.board.post(verdict)

    @traced("critic.review", "chain", attributes=lambda self, answer: {"input.value": answer.text})
    async def review(self, answer: Note) -> Note:
        """The critic's verdict on one answer; a broken critic accepts rather than blocks."""
        assert self.critic_agent is not None
        key = (answer.key[0], answer.key[1], answer.key[2] + 1)
        if self.revisions >= self.config.max_revisions:
            return Note(key, "verdict", self.cast.critic.name, "revision budget spent; accepting",
                        data={"verdict": "accept", "reason": "No revisions left.", "answer": answer.text})
        facts = "\n".join(f"- {n.source}: {n.text}" for n in self.board.notes("fact")[-8:]) or "(none)"
        prompt = CRITIC_REVIEW_PROMPT.format(answer=answer.text, evidence=answer.source, facts=facts).render()
        try:
            response = await self.critic_agent.step(BaseMessage.make_user_message("society", prompt), answer.key[0])
            if response.msg is None:
                raise JSONExtractionError("the critic stopped without a reply")
            verdict = extract_json(response.msg.content)
            if verdict.get("verdict") not in ("accept", "revise"):
                raise JSONExtractionError(f"unknown verdict {verdict.get('verdict')!r}")
        except (JSONExtractionError, ModelError) as exc:
            span = current_span()
            if span is not None:
                span.update({"pathfinder.fallback": "critic unavailable; accepting", "exception.message": str(exc)})
            verdict = {"verdict": "accept", "reason": f"critic unavailable ({type(exc).__name__}); accepted unchecked"}
        verdict["answer"] = answer.text
        return Note(key, "verdict", self.cast.critic.name, f"{verdict['verdict']}: {verdict.get('reason', '')}", data=verdict)

    def compose_user_input(self, reply: BaseMessage, feedback: str) -> BaseMessage:
        """What the user reads next: the assistant's reply, the verdict, relevant board facts."""
        parts = [reply.content]
        if feedback:
            parts.append(feedback)
        facts = self.board.relevant(reply.content, self.config.board_facts) if not feedback else []
        if facts:
            listing = "\n".join(f"- {n.source}: {n.text}" for n in facts)
            parts.append(BOARD_FACTS_NOTE.format(facts=listing).render())
        return BaseMessage.make_assistant_message(self.cast.assistant.name, "\n\n".join(parts))

    def aggregate_answer(self) -> tuple[str, bool]:
        """The answer the society stands by: the newest accepted one, else the newest given."""
        verdicts = {tuple(n.key[:2]): n for n in self.board.notes("verdict")}
        answers = self.board.notes("answer")
        for note in reversed(answers):
            verdict = verdicts.get(tuple(note.key[:2]))
            accepted = (note.data or {}).get("accepted") or (verdict is not None and (verdict.data or {}).get("verdict") == "accept")
            if accepted:
                return note.text, True
        return (answers[-1].text, False) if answers else ("", False)

