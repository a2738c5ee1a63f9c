"""Chat-completions client: request building, SSE streaming, response handling, retries.

Talks to any OpenAI-compatible endpoint over TCP (``http://host:port``) or a Unix socket
(``unix:/path``). Streaming is the default because long edits arrive faster that way; the
assembler rebuilds the message, tool calls and usage from the chunks.
"""

from __future__ import annotations

import http.client
import json
import socket
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from .config import ModelConfig
from .tokens import TokenCounter, UsageTracker
from .tracing import Tracer, clip_text


class ModelAPIError(Exception):
    """The endpoint answered with an error."""

    def __init__(self, status: int, message: str, error_type: str = "", code: str = "") -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.api_message = message
        self.error_type = error_type
        self.code = code


class BadRequestError(ModelAPIError):
    """HTTP 400: the request itself is wrong; retrying it unchanged cannot help."""


class ContextWindowExceededError(BadRequestError):
    """The prompt does not fit into the model's context window."""


class TransientModelError(ModelAPIError):
    """Rate limits, server errors and broken connections: worth another attempt."""


class ModelResponseError(Exception):
    """The response could not be decoded (malformed stream or body)."""


@dataclass
class ToolCall:
    call_id: str
    name: str
    arguments: str


@dataclass
class ModelResponse:
    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str = "stop"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    usage_reported: bool = False

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP over a Unix domain socket (``unix:/path/to/socket``)."""

    def __init__(self, socket_path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = socket_path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self.socket_path)
        self.sock = sock


def open_connection(base_url: str, timeout: float) -> tuple[http.client.HTTPConnection, str]:
    """Connection and path prefix for a base URL."""
    if base_url.startswith("unix:"):
        return UnixHTTPConnection(base_url[len("unix:") :], timeout), ""
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"PATHFINDER_LLM_URL: unsupported endpoint {base_url!r}")
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    return cls(parts.hostname, parts.port, timeout=timeout), parts.path.rstrip("/")


class StreamAssembler:
    """Rebuilds one assistant message from ``chat.completion.chunk`` deltas."""

    def __init__(self) -> None:
        self.content_parts: list[str] = []
        self.tool_calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.done = False

    def feed(self, chunk: dict[str, Any]) -> None:
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content"):
                self.content_parts.append(delta["content"])
            for fragment in delta.get("tool_calls") or []:
                index = fragment.get("index", 0)
                slot = self.tool_calls.setdefault(index, {"id": "", "name": "", "arguments": ""})
                if fragment.get("id"):
                    slot["id"] = fragment["id"]
                function = fragment.get("function") or {}
                if function.get("name"):
                    slot["name"] += function["name"]
                if function.get("arguments"):
                    slot["arguments"] += function["arguments"]
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]

    def message(self) -> tuple[str, list[ToolCall]]:
        calls = [
            ToolCall(call_id=slot["id"] or f"call_{index}", name=slot["name"], arguments=slot["arguments"])
            for index, slot in sorted(self.tool_calls.items())
        ]
        return "".join(self.content_parts), calls


def iter_sse_data(response: http.client.HTTPResponse):
    """Yield the ``data`` payload of each server-sent event; stops at ``[DONE]``.

    Lines are read whole before decoding, so a multi-byte character split across network
    chunks is never decoded in halves.
    """
    data_lines: list[str] = []
    while True:
        raw = response.readline()
        if not raw:
            if data_lines:
                yield "\n".join(data_lines)
            return
        line = raw.decode("utf-8").rstrip("\r\n")
        if not line:
            if data_lines:
                payload = "\n".join(data_lines)
                data_lines = []
                if payload.strip() == "[DONE]":
                    return
                yield payload
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        if name == "data":
            data_lines.append(value[1:] if value.startswith(" ") else value)


class LLMClient:
    """One model endpoint; every call records an ``llm.chat`` span."""

    def __init__(
        self,
        config: ModelConfig,
        tracer: Tracer,
        counter: TokenCounter,
        usage: UsageTracker,
        seed: int,
        script_prefix: str,
    ) -> None:
        self.config = config
        self.tracer = tracer
        self.counter = counter
        self.usage = usage
        self.seed = seed
        self.script_prefix = script_prefix

    def build_request(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> dict[str, Any]:
        cfg = self.config
        request: dict[str, Any] = {
            "model": cfg.model,
            "messages": messages,
            "temperature": cfg.temperature,
            "top_p": cfg.top_p,
            "max_tokens": cfg.max_tokens,
            "seed": self.seed,
            "stream": cfg.stream,
        }
        if cfg.stream:
            request["stream_options"] = {"include_usage": True}
        if tools:
            request["tools"] = tools
            request["tool_choice"] = cfg.tool_choice
            request["parallel_tool_calls"] = False
        if cfg.stop:
            request["stop"] = list(cfg.stop)
        return request

    def chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        conversation: str = "main",
    ) -> ModelResponse:
        """Send the conversation, retrying transient failures with exponential backoff."""
        request = self.build_request(messages, tools)
        attempts = self.config.retries + 1
        delay = self.config.retry_backoff_s
        for attempt in range(1, attempts + 1):
            try:
                return self._chat_once(request, conversation, attempt)
            except TransientModelError:
                if attempt == attempts:
                    raise
            except (ModelResponseError, OSError, http.client.HTTPException):
                if attempt == attempts:
                    raise
            time.sleep(delay)
            delay = min(delay * 2, self.config.retry_backoff_max_s)
        raise AssertionError("unreachable")

    def _chat_once(self, request: dict[str, Any], conversation: str, attempt: int) -> ModelResponse:
        cfg = self.config
        estimated_prompt = self.counter.count_request(request["messages"], request.get("tools"))
        attributes = {
            "gen_ai.operation.name": "chat",
            "gen_ai.system": "openai",
            "gen_ai.request.model": cfg.model,
            "gen_ai.request.temperature": request["temperature"],
            "gen_ai.request.top_p": request["top_p"],
            "gen_ai.request.max_tokens": request.get("max_tokens"),
            "gen_ai.request.seed": request["seed"],
            "gen_ai.request.stream": request["stream"],
            "pathfinder.conversation": conversation,
            "pathfinder.llm.attempt": attempt,
            "pathfinder.context.estimated_input_tokens": estimated_prompt,
            "pathfinder.request.tool_count": len(request.get("tools") or []),
            "input.value": clip_text(json.dumps(request["messages"], ensure_ascii=False)),
        }
        with self.tracer.span("llm.chat", "llm", attributes) as span:
            body = json.dumps(request).encode("utf-8")
            headers = {
                "Content-Type": "application/json",
                "Accept": "text/event-stream" if request["stream"] else "application/json",
                "X-Pathfinder-Script": f"{self.script_prefix}/{conversation}",
            }
            if cfg.api_key:
                headers["Authorization"] = f"Bearer {cfg.api_key}"
            conn, prefix = open_connection(cfg.base_url, cfg.timeout_s)
            try:
                conn.request("POST", f"{prefix}/v1/chat/completions", body=body, headers=headers)
                response = conn.getresponse()
                if response.status != 200:
                    raise self._api_error(response.status, response.read())
                if request["stream"]:
                    result = self._read_stream(response)
                else:
                    result = self._read_body(response)
            finally:
                conn.close()
            self._account(result, estimated_prompt)
            span.set_attributes(
                {
                    "gen_ai.response.finish_reasons": [result.finish_reason],
                    "gen_ai.usage.input_tokens": result.prompt_tokens,
                    "gen_ai.usage.output_tokens": result.completion_tokens,
                    "pathfinder.usage.reported_by_api": result.usage_reported,
                    "pathfinder.usage.total_tokens": self.usage.total_tokens,
                    "output.value": self._output_value(result),
                }
            )
            return result

    @staticmethod
    def _output_value(result: ModelResponse) -> str:
        if not result.tool_calls:
            return result.content
        calls = [{"id": c.call_id, "name": c.name, "arguments": c.arguments} for c in result.tool_calls]
        return json.dumps({"content": result.content, "tool_calls": calls}, ensure_ascii=False)

    @staticmethod
    def _api_error(status: int, raw: bytes) -> ModelAPIError:
        text = raw.decode("utf-8", errors="replace")
        message, error_type, code = text, "", ""
        try:
            error = json.loads(text).get("error") or {}
            message = error.get("message") or text
            error_type = error.get("type") or ""
            code = error.get("code") or ""
        except (ValueError, AttributeError):
            pass
        if status == 400:
            if code == "context_length_exceeded" or "context length" in message.lower():
                return ContextWindowExceededError(status, message, error_type, code)
            return BadRequestError(status, message, error_type, code)
        if status in (408, 409, 429) or status >= 500:
            return TransientModelError(status, message, error_type, code)
        return ModelAPIError(status, message, error_type, code)

    def _read_stream(self, response: http.client.HTTPResponse) -> ModelResponse:
        assembler = StreamAssembler()
        for payload in iter_sse_data(response):
            try:
                chunk = json.loads(payload)
            except ValueError as exc:
                raise ModelResponseError(f"malformed stream chunk: {payload[:80]!r}") from exc
            if "error" in chunk:
                err = chunk["error"] or {}
                raise TransientModelError(500, err.get("message", "stream error"), err.get("type", ""))
            assembler.feed(chunk)
        content, calls = assembler.message()
        if assembler.finish_reason is None:
            raise ModelResponseError("stream ended before a finish_reason arrived")
        result = ModelResponse(content=content, tool_calls=calls, finish_reason=assembler.finish_reason)
        if assembler.usage:
            result.prompt_tokens = int(assembler.usage.get("prompt_tokens") or 0)
            result.completion_tokens = int(assembler.usage.get("completion_tokens") or 0)
            result.usage_reported = True
        return result

    def _read_body(self, response: http.client.HTTPResponse) -> ModelResponse:
        try:
            body = json.loads(response.read().decode("utf-8"))
            choice = body["choices"][0]
            message = choice.get("message") or {}
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise ModelResponseError(f"malformed completion body: {exc}") from exc
        calls = [
            ToolCall(
                call_id=call.get("id") or f"call_{i}",
                name=(call.get("function") or {}).get("name", ""),
                arguments=(call.get("function") or {}).get("arguments") or "",
            )
            for i, call in enumerate(message.get("tool_calls") or [])
        ]
        result = ModelResponse(
            content=message.get("content") or "",
            tool_calls=calls,
            finish_reason=choice.get("finish_reason") or "stop",
        )
        usage = body.get("usage")
        if usage:
            result.prompt_tokens = int(usage.get("prompt_tokens") or 0)
            result.completion_tokens = int(usage.get("completion_tokens") or 0)
            result.usage_reported = True
        return result

    def _account(self, result: ModelResponse, estimated_prompt: int) -> None:
        """Fill in counts the endpoint did not report, then add them to the run's usage."""
        if not result.usage_reported:
            result.prompt_tokens = estimated_prompt
            completion_text = result.content + "".join(c.name + c.arguments for c in result.tool_calls)
            result.completion_tokens = self.counter.count_text(completion_text)
        self.usage.add(result.prompt_tokens, result.completion_tokens)
