"""The function-calling loop: ask the model, run the tools it calls, repeat until it answers."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from . import prompts
from .callbacks import Callbacks
from .history import Conversation, summarize_text
from .llm import ChatResult, ContextLengthExceeded, LLMClient, LLMError, LLMSettings, StreamError
from .parsing import normalize_text, parse_final_answer
from .tokens import ContextOverflow, ContextWindow, UsageMeter
from .tools import ToolContext, ToolExecutor, ToolRegistry
from .tracing import Tracer, clip

MAX_FORMAT_NUDGES = 2
MAX_REPEATED_CALLS = 3


@dataclass
class RunResult:
    status: str  # completed | failed | gave_up
    answer: str
    steps: int
    reason: str = ""


class FnCallAgent:
    def __init__(self, *, llm: LLMClient, registry: ToolRegistry, tracer: Tracer,
                 corpus_dir: str, window: ContextWindow, usage: UsageMeter,
                 max_steps: int = 10, max_run_tokens: int = 60_000,
                 callbacks: Callbacks | None = None) -> None:
        self.llm = llm
        self.registry = registry
        self.tracer = tracer
        self.window = window
        self.usage = usage
        self.max_steps = max_steps
        self.max_run_tokens = max_run_tokens
        self.callbacks = callbacks or Callbacks()
        self.ctx = ToolContext(corpus_dir=corpus_dir)
        self.executor = ToolExecutor(registry, self.ctx, tracer, self.callbacks)

    def run(self, question: str) -> RunResult:
        system = prompts.system_prompt("toolcaller", self.registry.names())
        convo = Conversation(system, prompts.task_message(normalize_text(question)))
        tools = self.registry.schemas()
        nudges = 0
        repeats = 0
        for step in range(self.max_steps):
            self.tracer.step_index = step
            with self.tracer.span("agent.step", kind="chain",
                                  attributes={"pathfinder.step": step}) as step_span:
                self.callbacks.emit("step_start", step=step)
                self.fit_context(convo, tools)
                reply = self.call_model(convo, tools)
                if reply is None:
                    return RunResult("failed", "", step + 1, "the model could not be reached")
                convo.add_reply(reply)
                if reply.tool_calls:
                    outcomes = self.executor.run_all(reply.tool_calls)
                    convo.add_tool_results(outcomes)
                    step_span.set("pathfinder.tool_calls", len(outcomes))
                    stop = self.check_termination(convo, step)
                    if stop is not None:
                        return stop
                    repeats = repeats + 1 if convo.last_tool_signature(1) == convo.last_tool_signature(2) else 0
                    if repeats + 1 >= MAX_REPEATED_CALLS:
                        return RunResult("gave_up", "", step + 1,
                                         f"the same tool calls were repeated {MAX_REPEATED_CALLS} times")
                    continue
                if reply.finish_reason == "length":
                    convo.add_user(prompts.NUDGE_TRUNCATED)
                    continue
                answer = self.extract_answer(reply)
                if answer is None:
                    nudges += 1
                    if nudges > MAX_FORMAT_NUDGES:
                        return RunResult("failed", normalize_text(reply.content or ""), step + 1,
                                         "no final answer in the expected format")
                    convo.add_user(prompts.NUDGE_FORMAT)
                    continue
                if answer.lower() == "unknown":
                    return RunResult("gave_up", answer, step + 1, "the model could not answer")
                return RunResult("completed", answer, step + 1)
        return RunResult("gave_up", "", self.max_steps, f"no answer within {self.max_steps} steps")

    def fit_context(self, convo: Conversation, tools: list[dict[str, Any]]) -> None:
        """Summarises or drops old turns when the prompt would not fit the window."""
        if self.window.fits(convo.messages, tools):
            return
        with self.tracer.span("context.fit", kind="other", code=ContextWindow.fit) as span:
            fitted, report = self.window.fit(convo.messages, tools, summarize_text)
            for key, value in report.items():
                span.set(f"pathfinder.context.{key}", value)
            convo.replace(fitted)

    def call_model(self, convo: Conversation, tools: list[dict[str, Any]]) -> ChatResult | None:
        """One model call, with fallbacks: a broken stream is retried without streaming, an
        over-long prompt is shortened once more. None when every path failed."""
        try:
            return self.llm.chat(convo.messages, tools, conversation="main",
                                 on_delta=lambda text: self.callbacks.emit("llm_delta", text=text))
        except ContextLengthExceeded as error:
            with self.tracer.span("agent.fallback", kind="other", attributes={
                    "pathfinder.fallback": "shrink_context", "exception.message": str(error)}):
                tighter = ContextWindow(limit=self.window.limit, reserve=self.window.reserve * 2,
                                        clip_chars=self.window.clip_chars // 2)
                try:
                    fitted, _ = tighter.fit(convo.messages, tools, summarize_text)
                except ContextOverflow:
                    return None
                convo.replace(fitted)
        except StreamError as error:
            with self.tracer.span("agent.fallback", kind="other", attributes={
                    "pathfinder.fallback": "non_streaming", "exception.message": str(error)}):
                self.llm.settings.stream = False
        except LLMError:
            return None
        try:
            return self.llm.chat(convo.messages, tools, conversation="main")
        except LLMError:
            return None

    def extract_answer(self, reply: ChatResult) -> str | None:
        with self.tracer.span("parse.final_answer", kind="chain", code=parse_final_answer,
                              attributes={"input.value": clip(reply.content or "")}) as span:
            answer = parse_final_answer(reply.content)
            span.set("output.value", "" if answer is None else answer)
            span.set("pathfinder.answer_found", answer is not None)
            return answer

    def check_termination(self, convo: Conversation, step: int) -> RunResult | None:
        """Budget checks after a tool step."""
        if self.usage.total > self.max_run_tokens:
            return RunResult("gave_up", "", step + 1,
                             f"token budget of {self.max_run_tokens} spent ({self.usage.total})")
        return None


def make_agent(settings, tracer: Tracer, registry: ToolRegistry) -> FnCallAgent:
    usage = UsageMeter()
    llm_settings = LLMSettings(url=settings.llm_url, model=settings.model,
                               temperature=settings.temperature, max_tokens=settings.max_tokens,
                               stream=settings.stream, api_key=settings.api_key,
                               script=settings.script)
    llm = LLMClient(llm_settings, tracer, settings.seed, usage)
    window = ContextWindow(limit=settings.context_limit, reserve=settings.max_tokens)
    return FnCallAgent(llm=llm, registry=registry, tracer=tracer, corpus_dir=settings.corpus_dir,
                       window=window, usage=usage, max_steps=settings.max_steps,
                       max_run_tokens=settings.max_run_tokens)


def load_task(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        task = json.load(f)
    if not isinstance(task, dict) or not isinstance(task.get("question"), str):
        raise ValueError(f"{path}: a task needs a string 'question'")
    return task
