"""Chat agents: one role each, with its own memory, model parameters and (optionally) tools."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .memory import ChatHistoryMemory, ContextCreator, ContextOverflowError, MemoryRecord
from .messages import BackendRole, BaseMessage
from .models import ModelBackend
from .roles import RoleSpec
from .tokens import TokenCounter
from .toolkit import Toolkit, ToolExecutor, ToolResult
from .tracing import current_span, traced


@dataclass
class ChatAgentResponse:
    msg: BaseMessage | None
    terminated: bool
    info: dict[str, Any] = field(default_factory=dict)


class ChatAgent:
    """Answers one input per :meth:`step`, running tool rounds until it replies in text."""

    def __init__(
        self,
        role: RoleSpec,
        system_prompt: str,
        model: ModelBackend,
        counter: TokenCounter,
        context_limit: int,
        toolkit: Toolkit | None = None,
        max_tool_rounds: int = 4,
        window_size: int | None = None,
    ) -> None:
        self.role = role
        self.model = model
        self.toolkit = toolkit
        self.executor = ToolExecutor(toolkit) if toolkit else None
        self.max_tool_rounds = max_tool_rounds
        self.memory = ChatHistoryMemory(window_size)
        self.context = ContextCreator(counter, context_limit)
        self.system_message = BaseMessage(role.name, role.role_type, system_prompt)
        self.memory.write_record(MemoryRecord(self.system_message, BackendRole.SYSTEM, 0))
        self.terminated = False
        self.round_index = 0

    @traced("agent.step", "agent", attributes=lambda self, input_message, turn: {
        "pathfinder.role": self.role.name,
        "pathfinder.conversation": self.role.conversation,
        "input.value": input_message.content,
    })
    async def step(self, input_message: BaseMessage, turn: int) -> ChatAgentResponse:
        if self.terminated:
            return ChatAgentResponse(None, True, {"termination_reasons": ["already_terminated"]})
        self.memory.write_record(MemoryRecord(input_message, BackendRole.USER, turn))
        tools = self.toolkit.openai_tools() if self.toolkit else None
        tool_results: list[ToolResult] = []
        for round_index in range(self.max_tool_rounds + 1):
            self.round_index = round_index
            # The last round offers no tools: the agent has to answer with what it has.
            offered = tools if round_index < self.max_tool_rounds else None
            try:
                messages, tokens = self.context.create_context(self.memory.retrieve(), offered)
            except ContextOverflowError as exc:
                return self._terminate("max_tokens_exceeded", str(exc))
            response = await self.model.run(messages, offered, self.role.conversation)
            reply = BaseMessage(
                self.role.name,
                self.role.role_type,
                response.content,
                tool_calls=response.tool_calls,
                meta={"finish_reason": response.finish_reason, "prompt_tokens": tokens},
            )
            self.memory.write_record(MemoryRecord(reply, BackendRole.ASSISTANT, turn, round_index))
            if not response.tool_calls:
                info = {"finish_reason": response.finish_reason, "tool_results": tool_results, "rounds": round_index}
                self._annotate(reply, info)
                return ChatAgentResponse(reply, False, info)
            assert self.executor is not None
            results = await self.executor.run_calls(response.tool_calls)
            tool_results.extend(results)
            for result in results:
                answer = BaseMessage(self.role.name, self.role.role_type, result.content, tool_call_id=result.call_id)
                self.memory.write_record(MemoryRecord(answer, BackendRole.TOOL, turn, round_index))
        return self._terminate("tool_round_limit", f"no text reply after {self.max_tool_rounds} tool rounds")

    def _terminate(self, reason: str, detail: str) -> ChatAgentResponse:
        self.terminated = True
        span = current_span()
        if span is not None:
            span.update({"pathfinder.termination_reason": reason, "pathfinder.termination_detail": detail})
        return ChatAgentResponse(None, True, {"termination_reasons": [reason], "detail": detail})

    @staticmethod
    def _annotate(reply: BaseMessage, info: dict[str, Any]) -> None:
        span = current_span()
        if span is not None:
            span.update({"output.value": reply.content, "pathfinder.tool_rounds": info["rounds"],
                         "gen_ai.response.finish_reasons": [info["finish_reason"]]})
