"""The model backend: an OpenAI-compatible chat-completions client with streaming.

Requests run in a worker thread (``asyncio.to_thread``) so the society's event loop keeps
serving the other roles. Streamed bodies are decoded incrementally: bytes are fed to an
incremental UTF-8 decoder (a character may straddle two network reads) and split into
server-sent events on blank lines.
"""

from __future__ import annotations

import asyncio
import codecs
import http.client
import json
import socket
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator
from urllib.parse import urlsplit

from .messages import ToolCallRequest
from .tokens import TokenCounter
from .tracing import current_span, traced


@dataclass
class ChatConfig:
    """Request parameters (the OpenAI names) and the client's own limits."""

    model: str = "pathfinder-scripted"
    temperature: float = 0.2
    top_p: float = 1.0
    max_tokens: int = 768
    stream: bool = True
    tool_choice: str = "auto"
    parallel_tool_calls: bool = True
    response_format: dict[str, Any] | None = None
    timeout: float = 60.0
    max_retries: int = 3
    backoff: float = 0.5

    def request_params(self, seed: int, tools: list[dict[str, Any]] | None) -> dict[str, Any]:
        params: dict[str, Any] = {
            "model": self.model,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_tokens": self.max_tokens,
            "seed": seed,
        }
        if self.stream:
            params["stream"] = True
            params["stream_options"] = {"include_usage": True}
        if tools:
            params["tools"] = tools
            params["tool_choice"] = self.tool_choice
            params["parallel_tool_calls"] = self.parallel_tool_calls
        if self.response_format is not None:
            params["response_format"] = self.response_format
        return params


class ModelError(Exception):
    def __init__(self, message: str, status: int = 0, code: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class BadRequestError(ModelError):
    """HTTP 400: resending the same request cannot succeed."""


class RetryableError(ModelError):
    """Rate limits, overload, server errors, dropped connections, broken streams."""


@dataclass
class ModelResponse:
    content: str
    tool_calls: list[ToolCallRequest]
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    usage_from_api: bool
    raw_chunks: int = 0


@dataclass
class _CallSlot:
    call_id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class ChunkAccumulator:
    """Folds ``chat.completion.chunk`` objects into one message."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.calls: dict[int, _CallSlot] = {}
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.chunks = 0

    def add(self, chunk: dict[str, Any]) -> str:
        """Fold one chunk in; returns the content delta it carried."""
        self.chunks += 1
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        delta_text = ""
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            piece = delta.get("content")
            if piece:
                self.text.append(piece)
                delta_text += piece
            for part in delta.get("tool_calls") or ():
                slot = self.calls.setdefault(int(part.get("index", 0)), _CallSlot())
                slot.call_id = part.get("id") or slot.call_id
                function = part.get("function") or {}
                slot.name = function.get("name") or slot.name
                if function.get("arguments"):
                    slot.arguments.append(function["arguments"])
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        return delta_text

    def tool_calls(self) -> list[ToolCallRequest]:
        return [
            ToolCallRequest(slot.call_id or f"call_{index}", slot.name, "".join(slot.arguments))
            for index, slot in sorted(self.calls.items())
        ]


def sse_events(read: Callable[[int], bytes], chunk_size: int = 1024) -> Iterator[str]:
    """``data`` payloads of a server-sent event stream, up to ``[DONE]``."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    buffer = ""
    while True:
        raw = read(chunk_size)
        buffer += decoder.decode(raw, final=not raw)
        buffer = buffer.replace("\r\n", "\n")
        while "\n\n" in buffer:
            block, buffer = buffer.split("\n\n", 1)
            data = [line[5:].lstrip(" ") if line.startswith("data:") else None for line in block.split("\n")]
            payload = "\n".join(d for d in data if d is not None)
            if not any(d is not None for d in data):
                continue  # a comment or keep-alive
            if payload.strip() == "[DONE]":
                return
            yield payload
        if not raw:
            if buffer.strip():
                raise RetryableError("stream ended in the middle of an event")
            return


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)


class ModelBackend:
    """One endpoint, shared by every role (each passes its own conversation key)."""

    def __init__(self, base_url: str, config: ChatConfig, seed: int, script_prefix: str, counter: TokenCounter, api_key: str = "") -> None:
        self.base_url = base_url
        self.config = config
        self.seed = seed
        self.script_prefix = script_prefix
        self.counter = counter
        self.api_key = api_key
        self.usage = {"prompt_tokens": 0, "completion_tokens": 0, "calls": 0}
        # Called with each streamed content delta (e.g. to echo the conversation live).
        self.on_delta: Callable[[str], None] | None = None

    def with_config(self, **changes: Any) -> "ModelBackend":
        """The same endpoint with different request parameters (e.g. JSON output)."""
        config = ChatConfig(**{**self.config.__dict__, **changes})
        twin = ModelBackend(self.base_url, config, self.seed, self.script_prefix, self.counter, self.api_key)
        twin.usage = self.usage
        twin.on_delta = self.on_delta
        return twin

    def _connection(self) -> tuple[http.client.HTTPConnection, str]:
        if self.base_url.startswith("unix:"):
            return _UnixConnection(self.base_url[5:], self.config.timeout), ""
        parts = urlsplit(self.base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ModelError(f"unsupported endpoint {self.base_url!r}")
        cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        return cls(parts.hostname, parts.port, timeout=self.config.timeout), parts.path.rstrip("/")

    async def run(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, conversation: str,
                  on_delta: Callable[[str], None] | None = None) -> ModelResponse:
        """Complete the conversation, retrying retryable failures with exponential backoff."""
        attempt = 0
        on_delta = on_delta or self.on_delta
        while True:
            attempt += 1
            try:
                return await self._complete(messages, tools, conversation, attempt, on_delta)
            except RetryableError:
                if attempt > self.config.max_retries:
                    raise
            except (OSError, http.client.HTTPException) as exc:
                if attempt > self.config.max_retries:
                    raise RetryableError(f"connection failed: {exc}") from exc
            await asyncio.sleep(self.config.backoff * (2 ** (attempt - 1)))

    @traced("llm.chat", "llm", attributes=lambda self, messages, tools, conversation, attempt, on_delta=None: {
        "gen_ai.operation.name": "chat",
        "gen_ai.system": "openai",
        "gen_ai.request.model": self.config.model,
        "gen_ai.request.temperature": self.config.temperature,
        "gen_ai.request.top_p": self.config.top_p,
        "gen_ai.request.max_tokens": self.config.max_tokens,
        "gen_ai.request.seed": self.seed,
        "gen_ai.request.stream": self.config.stream,
        "pathfinder.conversation": conversation,
        "pathfinder.llm.attempt": attempt,
        "pathfinder.request.tools": [t["function"]["name"] for t in tools or []],
        "pathfinder.request.response_format": (self.config.response_format or {}).get("type"),
        "input.value": json.dumps(messages, ensure_ascii=False),
    })
    async def _complete(self, messages, tools, conversation, attempt, on_delta) -> ModelResponse:
        estimate = self.counter.count_prompt(messages, tools)
        body = dict(self.config.request_params(self.seed, tools), messages=messages)
        response = await asyncio.to_thread(self._http, body, conversation, on_delta)
        if not response.usage_from_api:
            response.prompt_tokens = estimate
            response.completion_tokens = self.counter.count(response.content) + sum(
                self.counter.count(c.name) + self.counter.count(c.arguments) for c in response.tool_calls)
        self.usage["prompt_tokens"] += response.prompt_tokens
        self.usage["completion_tokens"] += response.completion_tokens
        self.usage["calls"] += 1
        span = current_span()
        if span is not None:
            output = response.content
            if response.tool_calls:
                output = json.dumps({"content": response.content, "tool_calls": [
                    {"id": c.call_id, "name": c.name, "arguments": c.arguments} for c in response.tool_calls]}, ensure_ascii=False)
            span.update({
                "gen_ai.usage.input_tokens": response.prompt_tokens,
                "gen_ai.usage.output_tokens": response.completion_tokens,
                "gen_ai.response.finish_reasons": [response.finish_reason],
                "pathfinder.context.estimated_input_tokens": estimate,
                "pathfinder.stream.chunks": response.raw_chunks,
                "output.value": output,
            })
        return response

    def _http(self, body: dict[str, Any], conversation: str, on_delta: Callable[[str], None] | None) -> ModelResponse:
        conn, prefix = self._connection()
        headers = {
            "Content-Type": "application/json",
            "X-Pathfinder-Script": f"{self.script_prefix}/{conversation}",
        }
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        try:
            conn.request("POST", f"{prefix}/v1/chat/completions", json.dumps(body, ensure_ascii=False).encode("utf-8"), headers)
            resp = conn.getresponse()
            if resp.status != 200:
                raise self._error(resp.status, resp.read())
            if body.get("stream"):
                return self._read_stream(resp, on_delta)
            return self._read_json(resp)
        finally:
            conn.close()

    @staticmethod
    def _error(status: int, raw: bytes) -> ModelError:
        message, code = raw.decode("utf-8", errors="replace"), ""
        try:
            err = json.loads(message)["error"]
            message, code = err.get("message", message), err.get("code") or ""
        except (ValueError, KeyError, TypeError):
            pass
        if status == 400:
            return BadRequestError(message, status, code)
        if status in (408, 429) or status >= 500:
            return RetryableError(message, status, code)
        return ModelError(message, status, code)

    @staticmethod
    def _read_stream(resp: http.client.HTTPResponse, on_delta: Callable[[str], None] | None) -> ModelResponse:
        acc = ChunkAccumulator()
        for payload in sse_events(resp.read1):
            try:
                chunk = json.loads(payload)
            except ValueError:
                raise RetryableError(f"undecodable stream chunk {payload[:60]!r}") from None
            if "error" in chunk:
                raise RetryableError(str((chunk.get("error") or {}).get("message", "error event in stream")))
            text = acc.add(chunk)
            if text and on_delta is not None:
                on_delta(text)
        if acc.finish_reason is None:
            raise RetryableError("stream closed before the finish_reason")
        usage = acc.usage or {}
        return ModelResponse("".join(acc.text), acc.tool_calls(), acc.finish_reason,
                             int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0)),
                             bool(acc.usage), acc.chunks)

    @staticmethod
    def _read_json(resp: http.client.HTTPResponse) -> ModelResponse:
        try:
            data = json.loads(resp.read().decode("utf-8"))
            choice = data["choices"][0]
        except (ValueError, KeyError, IndexError) as exc:
            raise RetryableError(f"undecodable completion: {exc}") from None
        message = choice.get("message") or {}
        calls = [ToolCallRequest(c.get("id", f"call_{i}"), c["function"]["name"], c["function"].get("arguments") or "")
                 for i, c in enumerate(message.get("tool_calls") or [])]
        usage = data.get("usage") or {}
        return ModelResponse(message.get("content") or "", calls, choice.get("finish_reason") or "stop",
                             int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0)), bool(usage))

