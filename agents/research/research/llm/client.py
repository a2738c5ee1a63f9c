"""The chat-completions client: request building, streaming, retries, usage and tracing.

The blocking HTTP work runs in a worker thread (`asyncio.to_thread`) so parallel researchers
overlap their waits; the span for each call is opened in that thread, and its parent comes
along through the copied context.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import random
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from research import tokens
from research.config import Settings
from research.events import EventBus
from research.llm.stream import Completion, StreamAssembler, StreamError, ToolCall, sse_events
from research.llm.transport import Endpoint, TransportError
from research.roles import Role
from research.tracing import Tracer

RETRYABLE_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})
SCRIPT_HEADER = "X-Pathfinder-Script"


class LLMError(RuntimeError):
    """A model call failed for good (after retries, or with a non-retryable error)."""


class APIError(LLMError):
    """The endpoint answered with an HTTP error and an OpenAI-style body."""

    def __init__(self, status: int, message: str, error_type: str = "", code: str | None = None,
                 param: str | None = None):
        super().__init__(f"HTTP {status} {error_type or 'error'}: {message}")
        self.status, self.message, self.error_type = status, message, error_type
        self.code, self.param = code, param

    @property
    def retryable(self) -> bool:
        return self.status in RETRYABLE_STATUS


class ContextOverflowError(APIError):
    """The prompt did not fit the model's window; the caller must shorten it."""


class IncompleteResponseError(LLMError):
    """The stream stopped early (timeout or dropped connection); the partial reply is unusable."""


@dataclass
class ChatResult:
    content: str | None
    tool_calls: list[ToolCall]
    finish_reason: str
    input_tokens: int
    output_tokens: int
    usage_from_api: bool
    attempts: int
    request: dict[str, Any] = field(repr=False, default_factory=dict)

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"

    def as_message(self) -> dict[str, Any]:
        """The assistant message to append to the conversation history."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [call.to_message() for call in self.tool_calls]
        elif self.content is None:
            message["content"] = ""
        return message


class RequestBuilder:
    """Builds request bodies with parameters the API accepts for each role."""

    def __init__(self, model: str, seed: int):
        self.model = model
        self.seed = seed

    def build(
        self,
        role: Role,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        tool_choice: str | None = None,
        response_format: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        temperature = min(2.0, max(0.0, float(role.temperature)))
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "temperature": temperature,
            "max_tokens": max(1, int(role.max_tokens)),
            "seed": self.seed,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if tools:
            body["tools"] = tools
            if tool_choice is not None:
                if tool_choice not in ("auto", "none", "required"):
                    raise ValueError(f"unsupported tool_choice {tool_choice!r}")
                body["tool_choice"] = tool_choice
        if response_format is not None:
            body["response_format"] = response_format
        return body


class LLMClient:
    """One client per run; safe to call from concurrent tasks."""

    def __init__(self, settings: Settings, tracer: Tracer, ledger: tokens.UsageLedger,
                 bus: EventBus):
        self.settings = settings
        self.limits = settings.limits
        self.endpoint = Endpoint.parse(settings.llm_url)
        self.builder = RequestBuilder(settings.model, settings.seed)
        self.tracer = tracer
        self.ledger = ledger
        self.bus = bus

    async def chat(
        self,
        role: Role,
        conversation: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        tool_choice: str | None = None,
        response_format: dict[str, Any] | None = None,
    ) -> ChatResult:
        body = self.builder.build(role, messages, tools, tool_choice, response_format)
        result = await asyncio.to_thread(self._chat_blocking, conversation, body)
        await self.bus.emit("llm.completed", conversation=conversation,
                            tokens=result.input_tokens + result.output_tokens)
        return result

    def _chat_blocking(self, conversation: str, body: dict[str, Any]) -> ChatResult:
        counted_input = tokens.count_prompt(body["messages"], body.get("tools"))
        attrs = {
            "gen_ai.operation.name": "chat",
            "gen_ai.system": "openai",
            "gen_ai.request.model": body["model"],
            "gen_ai.request.temperature": body["temperature"],
            "gen_ai.request.max_tokens": body["max_tokens"],
            "gen_ai.request.seed": body["seed"],
            "pathfinder.conversation": conversation,
            "pathfinder.tokens.counted_input": counted_input,
            "input.value": json.dumps(body["messages"], ensure_ascii=False),
        }
        if body.get("tools"):
            attrs["gen_ai.request.tool_names"] = [t["function"]["name"] for t in body["tools"]]
            attrs["gen_ai.request.tool_choice"] = body.get("tool_choice", "auto")
        if body.get("response_format"):
            attrs["gen_ai.request.response_format"] = body["response_format"].get("type", "")
        with self.tracer.span("llm.chat", "llm", attrs) as span:
            completion, attempts = self._with_retries(conversation, body)
            result = self._result(completion, counted_input, attempts, body)
            span.set({
                "gen_ai.usage.input_tokens": result.input_tokens,
                "gen_ai.usage.output_tokens": result.output_tokens,
                "pathfinder.usage.source": "api" if result.usage_from_api else "counted",
                "gen_ai.response.finish_reasons": [result.finish_reason],
                "pathfinder.attempts": attempts,
                "pathfinder.stream.chunks": completion.chunks,
                "pathfinder.stream.malformed_chunks": completion.malformed_chunks,
                "output.value": json.dumps(result.as_message(), ensure_ascii=False),
            })
        self.ledger.record(conversation, result.input_tokens, result.output_tokens)
        return result

    def _result(self, completion: Completion, counted_input: int, attempts: int,
                body: dict[str, Any]) -> ChatResult:
        usage = completion.usage or {}
        api_in, api_out = usage.get("prompt_tokens"), usage.get("completion_tokens")
        from_api = isinstance(api_in, int) and isinstance(api_out, int)
        if from_api:
            input_tokens, output_tokens = api_in, api_out
        else:
            input_tokens = counted_input
            output_tokens = tokens.count_text(completion.content) + sum(
                tokens.count_text(c.name) + tokens.count_text(c.arguments)
                for c in completion.tool_calls
            )
        return ChatResult(
            content=completion.content,
            tool_calls=completion.tool_calls,
            finish_reason=completion.finish_reason or "stop",
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            usage_from_api=from_api,
            attempts=attempts,
            request=body,
        )

    def _with_retries(self, conversation: str, body: dict[str, Any]) -> tuple[Completion, int]:
        """Retries transport failures, incomplete streams and retryable HTTP statuses."""
        rng = random.Random(f"{self.settings.seed}/{conversation}/{len(body['messages'])}")
        attempts = self.limits.retries + 1
        last: Exception | None = None
        for attempt in range(1, attempts + 1):
            try:
                return self._attempt(conversation, body), attempt
            except APIError as exc:
                if not exc.retryable:
                    raise
                last = exc
            except (TransportError, IncompleteResponseError) as exc:
                last = exc
            if attempt < attempts:
                delay = self.limits.backoff_s * (2 ** (attempt - 1)) * (1 + rng.random() / 2)
                with self.tracer.span("llm.retry", "other", {
                    "pathfinder.attempt": attempt,
                    "pathfinder.retry.delay_s": round(delay, 3),
                    "error.type": type(last).__name__,
                    "exception.message": str(last),
                }) as retry_span:
                    retry_span.error(str(last), type(last).__name__)
                    time.sleep(delay)
        raise LLMError(f"model call failed after {attempts} attempts: {last}") from last

    def _attempt(self, conversation: str, body: dict[str, Any]) -> Completion:
        payload = json.dumps(body, ensure_ascii=False).encode("utf-8")
        headers = {
            "Content-Type": "application/json",
            "Accept": "text/event-stream",
            SCRIPT_HEADER: f"{self.settings.script_prefix}/{conversation}",
        }
        deadline = time.monotonic() + self.limits.request_timeout_s
        try:
            conn = self.endpoint.connect(self.limits.request_timeout_s)
        except OSError as exc:
            raise TransportError(f"cannot connect to {self.settings.llm_url}: {exc}") from exc
        try:
            try:
                conn.request("POST", self.endpoint.chat_path, body=payload, headers=headers)
                response = conn.getresponse()
            except (OSError, http.client.HTTPException) as exc:
                raise TransportError(f"request to {self.settings.llm_url} failed: {exc}") from exc
            if response.status >= 400:
                raise self._api_error(response.status, response.read())
            content_type = response.getheader("Content-Type", "")
            if "text/event-stream" not in content_type:
                return self._plain_completion(response.read())
            return self._read_stream(response, deadline)
        finally:
            conn.close()

    def _read_stream(self, response: http.client.HTTPResponse, deadline: float) -> Completion:
        assembler = StreamAssembler()

        def lines():
            while True:
                if time.monotonic() > deadline:
                    raise IncompleteResponseError(
                        f"stream exceeded {self.limits.request_timeout_s}s after "
                        f"{assembler.chunks} chunk(s)")
                try:
                    line = response.readline()
                except (socket.timeout, TimeoutError) as exc:
                    raise IncompleteResponseError(f"stream read timed out: {exc}") from exc
                except (OSError, http.client.HTTPException) as exc:
                    raise IncompleteResponseError(f"stream broke off: {exc}") from exc
                if not line:
                    return
                yield line

        try:
            for data in sse_events(lines()):
                assembler.feed_data(data)
                if assembler.done:
                    break
            return assembler.finish()
        except StreamError as exc:
            raise IncompleteResponseError(str(exc)) from exc

    @staticmethod
    def _plain_completion(raw: bytes) -> Completion:
        """A non-streamed body (some endpoints ignore `stream`)."""
        try:
            data = json.loads(raw.decode("utf-8", errors="replace"))
            choice = data["choices"][0]
            message = choice.get("message") or {}
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise IncompleteResponseError(f"unreadable completion body: {exc}") from exc
        calls = [
            ToolCall(c.get("id", f"call_{i}"), c["function"]["name"],
                     c["function"].get("arguments", ""))
            for i, c in enumerate(message.get("tool_calls") or [])
        ]
        return Completion(message.get("content"), calls, choice.get("finish_reason"),
                          data.get("usage"), chunks=1, done=True)

    @staticmethod
    def _api_error(status: int, raw: bytes) -> APIError:
        text = raw.decode("utf-8", errors="replace")
        try:
            error = json.loads(text).get("error") or {}
        except (ValueError, AttributeError):
            error = {"message": text[:500]}
        if not isinstance(error, dict):
            error = {"message": str(error)}
        cls = ContextOverflowError if error.get("code") == "context_length_exceeded" else APIError
        return cls(status, str(error.get("message", "")), str(error.get("type") or ""),
                   error.get("code"), error.get("param"))
