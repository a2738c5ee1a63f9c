"""The agent loop: query the model, parse one action, run it, observe, until submission.

Termination is the agent's own: an accepted ``submit``, or a limit (steps, cost, format
errors, context) after which the current changes are submitted automatically, as SWE-agent
does, so work done before the limit is never lost.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .commands import CommandRegistry
from .config import AgentConfig
from .environment import SWEEnvironment
from .executor import ToolExecutor
from .history import ContextWindow, ContextWindowExceeded, History, ObservationCompressor, Turn
from .hooks import HookRegistry
from .llm import BadRequestError, ContextWindowExceededError, LLMClient, ModelAPIError, ModelResponse
from .parsing import Action, ActionParser, FormatError
from .prompts import (
    EMPTY_SUBMISSION_TEMPLATE,
    NEXT_STEP_NO_OUTPUT_TEMPLATE,
    NEXT_STEP_TEMPLATE,
    REVIEW_TEMPLATE,
    STEPS_LEFT_TEMPLATE,
    build_format_error_prompt,
    build_instance_prompt,
    build_system_prompt,
    render_template,
)
from .tokens import TokenCounter
from .tracing import Tracer


@dataclass
class RunResult:
    status: str  # completed | failed | gave_up
    exit_reason: str  # submitted | step_limit | cost_limit | format_errors | context | model_error
    submission: str
    steps: int


class StopRun(Exception):
    """Ends the loop with the given status; the current changes are then auto-submitted."""

    def __init__(self, status: str, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class SubmissionReviewer:
    """Asks the model to look over its diff once before a submission is accepted."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.reviewed = False
        self.empty_warned = False

    def review(self, diff: str) -> str | None:
        """None accepts the submission; otherwise the message to show the model instead."""
        if not diff.strip() and not self.empty_warned:
            self.empty_warned = True
            return EMPTY_SUBMISSION_TEMPLATE
        if self.enabled and not self.reviewed and diff.strip():
            self.reviewed = True
            return render_template(REVIEW_TEMPLATE, diff=diff)
        return None


class Agent:
    def __init__(
        self,
        config: AgentConfig,
        task: dict[str, Any],
        env: SWEEnvironment,
        llm: LLMClient,
        tracer: Tracer,
        hooks: HookRegistry,
    ) -> None:
        self.config = config
        self.task = task
        self.env = env
        self.llm = llm
        self.tracer = tracer
        self.hooks = hooks
        self.registry = CommandRegistry()
        self.parser = ActionParser(self.registry, config.parse_mode)
        self.executor = ToolExecutor(env, tracer, config.max_observation_chars)
        self.counter = TokenCounter()
        self.window = ContextWindow(
            self.counter,
            ObservationCompressor(config.keep_last_observations),
            config.model.context_window,
            config.model.max_tokens,
            config.context_margin_tokens,
            tracer,
        )
        self.reviewer = SubmissionReviewer(config.review_on_submit)
        self.history = History()
        self.tools = self.registry.tool_schemas() if config.parse_mode != "thought_action" else None
        self.step = 0
        self.submission: str | None = None

    # ----- setup -------------------------------------------------------------------------

    def setup(self) -> None:
        system = build_system_prompt(self.registry.docs(), self.config.window_lines)
        self.history.append(Turn("system", system, "system"))
        self.history.append(Turn("user", build_instance_prompt(self.task), "instance"))

    # ----- the loop ------------------------------------------------------------------------

    def run(self) -> RunResult:
        self.setup()
        self.hooks.fire("on_run_start", self.task["id"])
        status, reason = "completed", "submitted"
        try:
            while self.submission is None:
                self.step += 1
                Tracer.set_step(self.step)
                stopped: StopRun | None = None
                with self.tracer.span("agent.step", "chain", {"pathfinder.step_index": self.step}) as span:
                    try:
                        self.hooks.fire("on_step_start", self.step)
                        self.check_limits()
                        self.run_step()
                        self.hooks.fire("on_step_done", self.step)
                    except StopRun as stop:
                        # Ending the run is the loop's decision, not a failure of this step.
                        span.set_attribute("pathfinder.exit_reason", stop.reason)
                        stopped = stop
                if stopped is not None:
                    raise stopped
        except StopRun as stop:
            status, reason = stop.status, stop.reason
            self.submission = self.autosubmit(reason)
        steps = self.step
        self.hooks.fire("on_run_done", status, self.submission or "")
        return RunResult(status, reason, self.submission or "", steps)

    def check_limits(self) -> None:
        """Stop before a step that would exceed the step or cost limit."""
        if self.step > self.config.step_limit:
            self.step -= 1
            raise StopRun("gave_up", "step_limit")
        if self.llm.usage.cost >= self.config.cost_limit:
            self.step -= 1
            raise StopRun("gave_up", "cost_limit")

    def run_step(self) -> None:
        action = self.query_action()
        call_id = action.call_id or f"step-{self.step}"
        self.hooks.fire("on_action", self.step, action.thought, action.text)
        observation = self.executor.execute(action, call_id)
        text = observation.text
        if action.command.name == "submit" and self.env.pending_submission is not None:
            diff, self.env.pending_submission = self.env.pending_submission, None
            feedback = self.reflect_on_submission(diff)
            if feedback is None:
                self.submission = diff
                return
            text = feedback
        self.hooks.fire("on_observation", self.step, text)
        self.add_observation(action, text)

    def reflect_on_submission(self, diff: str) -> str | None:
        with self.tracer.span("agent.review_submission", "chain", {"input.value": diff}) as span:
            feedback = self.reviewer.review(diff)
            span.set_attribute("pathfinder.review.accepted", feedback is None)
            span.set_attribute("output.value", feedback or "accepted")
            return feedback

    def add_observation(self, action: Action, text: str) -> None:
        steps_left = self.config.step_limit - self.step
        if not text.strip():
            content = render_template(NEXT_STEP_NO_OUTPUT_TEMPLATE, state=self.env.state_line())
        else:
            content = render_template(NEXT_STEP_TEMPLATE, observation=text, state=self.env.state_line())
        if 0 < steps_left <= 2:
            content += render_template(STEPS_LEFT_TEMPLATE, steps_left=steps_left)
        if action.source == "function":
            self.history.append(Turn("tool", content, "observation", self.step, tool_call_id=action.call_id))
        else:
            self.history.append(Turn("user", content, "observation", self.step))

    # ----- querying ------------------------------------------------------------------------

    def query_action(self) -> Action:
        """Ask the model until one reply parses, showing it the format after each miss."""
        retries = 0
        while True:
            response = self.query_model()
            with self.tracer.span("agent.parse_action", "chain", {"input.value": response.content}) as span:
                try:
                    if response.truncated:
                        raise FormatError("the reply was cut off at the completion limit; keep it shorter")
                    action = self.parser.parse(response)
                except FormatError as exc:
                    span.record_exception(exc)
                    error = str(exc)
                else:
                    span.set_attribute("output.value", action.text)
                    span.set_attribute("pathfinder.action.command", action.command.name)
                    self.record_reply(response)
                    return action
            self.record_reply(response)
            self.record_format_error(response, error)
            retries += 1
            if retries > self.config.max_format_retries:
                raise StopRun("gave_up", "format_errors")

    def query_model(self) -> ModelResponse:
        try:
            messages = self.window.fit(self.history, self.tools)
        except ContextWindowExceeded:
            raise StopRun("failed", "context") from None
        try:
            return self.llm.chat(messages, self.tools, conversation="main")
        except ContextWindowExceededError:
            # The endpoint counts differently from us: retry once with everything collapsed.
            return self.query_compacted()
        except ModelAPIError:
            raise StopRun("failed", "model_error") from None
        except OSError:
            raise StopRun("failed", "model_error") from None

    def query_compacted(self) -> ModelResponse:
        compact = ContextWindow(
            self.counter,
            ObservationCompressor(0),
            self.config.model.context_window // 2,
            self.config.model.max_tokens,
            self.config.context_margin_tokens,
            self.tracer,
        )
        try:
            messages = compact.fit(self.history, self.tools)
            return self.llm.chat(messages, self.tools, conversation="main")
        except (ContextWindowExceeded, BadRequestError):
            raise StopRun("failed", "context") from None
        except (ModelAPIError, OSError):
            raise StopRun("failed", "model_error") from None

    def record_reply(self, response: ModelResponse) -> None:
        calls = [{"id": c.call_id, "name": c.name, "arguments": c.arguments} for c in response.tool_calls]
        self.history.append(Turn("assistant", response.content, "action", self.step, tool_calls=calls or None))

    def record_format_error(self, response: ModelResponse, error: str) -> None:
        message = build_format_error_prompt(error)
        if response.tool_calls:
            # Every tool call needs an answer before the conversation may continue.
            for call in response.tool_calls:
                self.history.append(Turn("tool", message, "format_error", self.step, tool_call_id=call.call_id))
        else:
            self.history.append(Turn("user", message, "format_error", self.step))

    # ----- fallback ------------------------------------------------------------------------

    def autosubmit(self, reason: str) -> str:
        """Submit whatever the repository holds now, so a limit does not discard the work."""
        with self.tracer.span("agent.autosubmit", "chain", {"pathfinder.exit_reason": reason}) as span:
            diff = self.env.diff()
            span.set_attribute("output.value", diff)
            return diff


def result_record(task_id: str, result: RunResult) -> dict[str, Any]:
    return {"task_id": task_id, "status": result.status, "answer": result.submission, "steps": result.steps}


def dumps_result(record: dict[str, Any]) -> str:
    return json.dumps(record, ensure_ascii=False, indent=2)
