"""The chat-completions client: request building, SSE streaming, retries.

Talks to any OpenAI-compatible endpoint over TCP or a Unix socket with `http.client` only.
A streamed reply arrives as server-sent events whose boundaries fall anywhere (even inside a
UTF-8 sequence); `SSEDecoder` turns bytes into events and `StreamAssembler` turns the chunk
deltas into one message, including tool calls whose arguments come in fragments.
"""

from __future__ import annotations

import codecs
import http.client
import json
import random
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Callable
from urllib.parse import urlsplit

from . import tokens
from .tracing import Tracer, clip

CHAT_PATH = "/v1/chat/completions"


class LLMError(Exception):
    """A failed model call. `status` is the HTTP status (0 for transport errors)."""

    def __init__(self, message: str, status: int = 0, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class ContextLengthExceeded(LLMError):
    """The provider rejected the prompt as longer than the context window."""


class StreamError(LLMError):
    """The stream ended without a finish reason or held an undecodable event."""


# --------------------------------------------------------------------------- transport

class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP over a Unix domain socket."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self.socket_path)
        self.sock = sock


@dataclass(frozen=True)
class Endpoint:
    """Where to send requests: `http://host:port[/base]`, `https://…` or `unix:/path`."""

    scheme: str
    host: str = ""
    port: int = 0
    path: str = ""
    base: str = ""

    @staticmethod
    def parse(url: str) -> "Endpoint":
        if url.startswith("unix:"):
            path = url[len("unix:"):]
            if path.startswith("//"):
                path = path[2:]
            if not path:
                raise ValueError(f"no socket path in {url!r}")
            return Endpoint("unix", path=path)
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"unsupported LLM URL {url!r}: use http://HOST:PORT or unix:/path")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        base = parts.path.rstrip("/")
        if base.endswith("/v1"):
            base = base[: -len("/v1")]
        return Endpoint(parts.scheme, parts.hostname, port, base=base)

    def connect(self, timeout: float) -> http.client.HTTPConnection:
        if self.scheme == "unix":
            return UnixHTTPConnection(self.path, timeout)
        if self.scheme == "https":
            return http.client.HTTPSConnection(self.host, self.port, timeout=timeout)
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)


# --------------------------------------------------------------------------- streaming

class SSEDecoder:
    """Bytes of a `text/event-stream` in, the `data` of each event out.

    Bytes are decoded incrementally so that a multi-byte character split across two reads
    is decoded whole; undecodable bytes become U+FFFD instead of failing the stream.
    """

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._buffer = ""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[str]:
        self._buffer += self._decoder.decode(chunk)
        events: list[str] = []
        while True:
            cut = self._line_end(self._buffer)
            if cut is None:
                break
            end, width = cut
            line = self._buffer[:end]
            self._buffer = self._buffer[end + width:]
            self._line(line, events)
        return events

    def close(self) -> list[str]:
        self._buffer += self._decoder.decode(b"", final=True)
        events: list[str] = []
        if self._buffer:
            self._line(self._buffer, events)
            self._buffer = ""
        self._line("", events)
        return events

    @staticmethod
    def _line_end(buffer: str) -> tuple[int, int] | None:
        for i, ch in enumerate(buffer):
            if ch == "\n":
                return i, 1
            if ch == "\r":
                if i + 1 == len(buffer):
                    return None  # could be the first half of \r\n
                return (i, 2) if buffer[i + 1] == "\n" else (i, 1)
        return None

    def _line(self, line: str, events: list[str]) -> None:
        if line == "":
            if self._data:
                events.append("\n".join(self._data))
                self._data = []
            return
        if line.startswith(":"):
            return  # comment / keep-alive
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str


@dataclass
class ChatResult:
    content: str | None
    tool_calls: list[ToolCall]
    finish_reason: str | None
    server_usage: dict[str, int] | None = None
    model: str | None = None

    def as_message(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function",
                 "function": {"name": c.name, "arguments": c.arguments}}
                for c in self.tool_calls
            ]
        return message


@dataclass
class StreamAssembler:
    """Accumulates streamed chunk deltas into one reply."""

    content: list[str] = field(default_factory=list)
    calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    finish_reason: str | None = None
    usage: dict[str, int] | None = None
    model: str | None = None
    saw_content: bool = False
    on_delta: Callable[[str], None] | None = None

    def feed(self, chunk: dict[str, Any]) -> None:
        if chunk.get("model"):
            self.model = chunk["model"]
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            text = delta.get("content")
            if text:
                self.content.append(text)
                self.saw_content = True
                if self.on_delta is not None:
                    self.on_delta(text)
            for part in delta.get("tool_calls") or []:
                index = part.get("index", len(self.calls))
                slot = self.calls.setdefault(index, {"id": "", "name": "", "arguments": []})
                if part.get("id"):
                    slot["id"] = part["id"]
                function = part.get("function") or {}
                if function.get("name"):
                    slot["name"] += function["name"]
                if function.get("arguments"):
                    slot["arguments"].append(function["arguments"])
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]

    def result(self) -> ChatResult:
        calls = [
            ToolCall(id=slot["id"] or f"call_{index}", name=slot["name"],
                     arguments="".join(slot["arguments"]))
            for index, slot in sorted(self.calls.items())
        ]
        content = "".join(self.content) if self.saw_content else None
        return ChatResult(content, calls, self.finish_reason, self.usage, self.model)


def result_from_json(body: dict[str, Any]) -> ChatResult:
    """A non-streamed response body as a ChatResult."""
    choices = body.get("choices") or []
    if not choices:
        raise LLMError("the response has no choices", 200)
    choice = choices[0]
    message = choice.get("message") or {}
    calls = [
        ToolCall(id=c.get("id", f"call_{i}"), name=c.get("function", {}).get("name", ""),
                 arguments=c.get("function", {}).get("arguments", ""))
        for i, c in enumerate(message.get("tool_calls") or [])
    ]
    return ChatResult(message.get("content"), calls, choice.get("finish_reason"),
                      body.get("usage"), body.get("model"))


# --------------------------------------------------------------------------- requests

@dataclass
class LLMSettings:
    url: str
    model: str = "pathfinder-scripted"
    temperature: float = 0.2
    max_tokens: int = 1024
    stream: bool = True
    timeout: float = 60.0
    api_key: str | None = None
    script: str | None = None  # NAME/TASK_ID


def to_provider_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """History messages in the OpenAI wire format: only wire fields, tool-call arguments as
    JSON text, tool results as strings."""
    wire: list[dict[str, Any]] = []
    for m in messages:
        out: dict[str, Any] = {"role": m["role"]}
        content = m.get("content")
        if m["role"] == "tool":
            out["tool_call_id"] = m["tool_call_id"]
            out["content"] = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
        else:
            out["content"] = content
        if m.get("name") and m["role"] in ("user", "system"):
            out["name"] = m["name"]
        if m.get("tool_calls"):
            out["tool_calls"] = []
            for call in m["tool_calls"]:
                args = call["function"]["arguments"]
                if not isinstance(args, str):
                    args = json.dumps(args, ensure_ascii=False)
                out["tool_calls"].append({"id": call["id"], "type": "function",
                                          "function": {"name": call["function"]["name"],
                                                       "arguments": args}})
        wire.append(out)
    return wire


def build_request(settings: LLMSettings, messages: list[dict[str, Any]],
                  tools: list[dict[str, Any]] | None, seed: int,
                  response_format: dict[str, Any] | None = None) -> dict[str, Any]:
    """The chat-completions request body."""
    body: dict[str, Any] = {
        "model": settings.model,
        "messages": to_provider_messages(messages),
        "temperature": settings.temperature,
        "max_tokens": settings.max_tokens,
        "seed": seed,
        "stream": settings.stream,
    }
    if settings.stream:
        body["stream_options"] = {"include_usage": True}
    if tools:
        body["tools"] = tools
        body["tool_choice"] = "auto"
    if response_format:
        body["response_format"] = response_format
    return body


# --------------------------------------------------------------------------- retries

@dataclass
class RetryPolicy:
    """Exponential backoff with jitter for transient failures."""

    attempts: int = 4
    base_delay: float = 0.2
    max_delay: float = 4.0

    @staticmethod
    def retryable(error: LLMError) -> bool:
        """Transport errors, rate limits and server errors are transient; other 4xx are not."""
        return error.status == 0 or error.status == 429 or error.status >= 500

    def delay(self, attempt: int, rng: random.Random) -> float:
        return min(self.max_delay, self.base_delay * (2 ** attempt)) * (0.5 + rng.random() / 2)


# --------------------------------------------------------------------------- the client

class LLMClient:
    def __init__(self, settings: LLMSettings, tracer: Tracer, seed: int,
                 usage: tokens.UsageMeter, retry: RetryPolicy | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.settings = settings
        self.endpoint = Endpoint.parse(settings.url)
        self.tracer = tracer
        self.seed = seed
        self.usage = usage
        self.retry = retry or RetryPolicy()
        self.sleep = sleep
        self._rng = random.Random(seed)

    def chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
             conversation: str = "main", on_delta: Callable[[str], None] | None = None,
             response_format: dict[str, Any] | None = None) -> ChatResult:
        """One completion, retried on transient failures; recorded as an `llm.chat` span."""
        body = build_request(self.settings, messages, tools, self.seed, response_format)
        input_tokens = tokens.count_prompt(body["messages"], tools)
        attributes = {
            "gen_ai.operation.name": "chat",
            "gen_ai.system": "openai",
            "gen_ai.request.model": self.settings.model,
            "gen_ai.request.temperature": self.settings.temperature,
            "gen_ai.request.max_tokens": self.settings.max_tokens,
            "gen_ai.usage.input_tokens": input_tokens,
            "pathfinder.conversation": conversation,
            "input.value": clip(json.dumps(body["messages"], ensure_ascii=False)),
        }
        with self.tracer.span("llm.chat", kind="llm", attributes=attributes) as span:
            attempt = 0
            while True:
                try:
                    result = self._send(body, conversation, on_delta)
                    break
                except LLMError as error:
                    if not self.retry.retryable(error) or attempt + 1 >= self.retry.attempts:
                        span.set("pathfinder.llm.attempts", attempt + 1)
                        raise
                    delay = self.retry.delay(attempt, self._rng)
                    with self.tracer.span("llm.retry", kind="other", attributes={
                        "pathfinder.retry.attempt": attempt + 1,
                        "pathfinder.retry.delay_s": round(delay, 3),
                        "error.type": type(error).__name__,
                        "http.response.status_code": error.status,
                        "exception.message": str(error),
                    }):
                        self.sleep(delay)
                    attempt += 1
            output_tokens = tokens.count_tokens(result.content) + sum(
                tokens.count_tokens(c.name) + tokens.count_tokens(c.arguments)
                for c in result.tool_calls)
            self.usage.record(input_tokens, output_tokens)
            span.set("pathfinder.llm.attempts", attempt + 1)
            span.set("gen_ai.usage.output_tokens", output_tokens)
            span.set("gen_ai.response.finish_reasons", [result.finish_reason or ""])
            if result.model:
                span.set("gen_ai.response.model", result.model)
            span.set("output.value", clip(json.dumps(result.as_message(), ensure_ascii=False)))
            return result

    def _headers(self, conversation: str) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"
                   if self.settings.stream else "application/json"}
        if self.settings.script:
            headers["X-Pathfinder-Script"] = f"{self.settings.script}/{conversation}"
        if self.settings.api_key:
            headers["Authorization"] = f"Bearer {self.settings.api_key}"
        return headers

    def _send(self, body: dict[str, Any], conversation: str,
              on_delta: Callable[[str], None] | None) -> ChatResult:
        payload = json.dumps(body, ensure_ascii=False).encode("utf-8")
        conn = self.endpoint.connect(self.settings.timeout)
        try:
            try:
                conn.request("POST", self.endpoint.base + CHAT_PATH, body=payload,
                             headers=self._headers(conversation))
                response = conn.getresponse()
            except (OSError, http.client.HTTPException) as exc:
                raise LLMError(f"cannot reach {self.settings.url}: {exc}") from exc
            if response.status != 200:
                raise self._http_error(response)
            if not self.settings.stream:
                try:
                    return result_from_json(json.loads(response.read().decode("utf-8", errors="replace")))
                except ValueError as exc:
                    raise LLMError(f"the response is not JSON: {exc}", 200) from exc
            return self._read_stream(response, on_delta)
        finally:
            conn.close()

    @staticmethod
    def _http_error(response: http.client.HTTPResponse) -> LLMError:
        raw = response.read().decode("utf-8", errors="replace")
        message, code = raw.strip() or response.reason, None
        try:
            error = json.loads(raw).get("error", {})
            message = error.get("message") or message
            code = error.get("code")
        except (ValueError, AttributeError):
            pass
        cls = ContextLengthExceeded if code == "context_length_exceeded" else LLMError
        return cls(f"HTTP {response.status}: {message}", response.status, code)

    @staticmethod
    def _read_stream(response: http.client.HTTPResponse,
                     on_delta: Callable[[str], None] | None) -> ChatResult:
        decoder = SSEDecoder()
        assembler = StreamAssembler(on_delta=on_delta)
        done = False
        while not done:
            try:
                data = response.read1(8192)
            except (OSError, http.client.HTTPException) as exc:
                raise StreamError(f"the stream broke off: {exc}") from exc
            events = decoder.feed(data) if data else decoder.close()
            for event in events:
                if event.strip() == "[DONE]":
                    done = True
                    break
                try:
                    chunk = json.loads(event)
                except ValueError as exc:
                    raise StreamError(f"undecodable stream event {event[:80]!r}", 200) from exc
                if isinstance(chunk, dict) and "error" in chunk:
                    raise LLMError(f"error in stream: {chunk['error']}", 500)
                assembler.feed(chunk)
            if not data:
                break
        result = assembler.result()
        if result.finish_reason is None:
            raise StreamError("the stream ended before a finish reason", 0)
        return result
