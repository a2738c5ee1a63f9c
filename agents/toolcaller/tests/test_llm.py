"""The streaming client: SSE decoding, delta assembly, retries, request building."""

import json
import unittest

from toolcaller.llm import (ChatResult, Endpoint, LLMError, RetryPolicy, SSEDecoder,
                            StreamAssembler, build_request, LLMSettings, to_provider_messages)


def sse(*payloads):
    return "".join(f"data: {p}\n\n" for p in payloads).encode("utf-8")


class SSEDecoderTest(unittest.TestCase):
    def test_events_survive_any_split(self):
        stream = (b": keep-alive\n\n" + sse(json.dumps({"x": "Zo\u00eb \u6771\u4eac"}), "[DONE]"))
        for size in range(1, 12):
            decoder = SSEDecoder()
            events = []
            for i in range(0, len(stream), size):
                events += decoder.feed(stream[i:i + size])
            events += decoder.close()
            self.assertEqual(events, [json.dumps({"x": "Zo\u00eb \u6771\u4eac"}), "[DONE]"], size)

    def test_crlf_and_multiline_data(self):
        decoder = SSEDecoder()
        events = decoder.feed(b"data: a\r\ndata: b\r\n\r\nevent: x\ndata: c\n\n")
        self.assertEqual(events, ["a\nb", "c"])

    def test_invalid_bytes_become_replacement_characters(self):
        decoder = SSEDecoder()
        self.assertEqual(decoder.feed(b"data: \xff\n\n"), ["\ufffd"])


class StreamAssemblerTest(unittest.TestCase):
    def test_tool_call_fragments_assemble_by_index(self):
        a = StreamAssembler()
        chunks = [
            {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
            {"choices": [{"index": 0, "delta": {"tool_calls": [
                {"index": 0, "id": "call_a", "type": "function", "function": {"name": "search", "arguments": ""}}]}}]},
            {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{\"qu"}}]}}]},
            {"choices": [{"index": 0, "delta": {"tool_calls": [
                {"index": 1, "id": "call_b", "type": "function", "function": {"name": "calculator", "arguments": "{\"expression\""}}]}}]},
            {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "ery\": \"x\"}"}}]}}]},
            {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 1, "function": {"arguments": ": \"1+1\"}"}}]}}]},
            {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
            {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}},
        ]
        for c in chunks:
            a.feed(c)
        r = a.result()
        self.assertIsNone(r.content)
        self.assertEqual([(c.id, c.name, json.loads(c.arguments)) for c in r.tool_calls],
                         [("call_a", "search", {"query": "x"}), ("call_b", "calculator", {"expression": "1+1"})])
        self.assertEqual(r.finish_reason, "tool_calls")
        self.assertEqual(r.server_usage["total_tokens"], 8)

    def test_content_deltas_concatenate(self):
        a = StreamAssembler()
        for piece in ["{\"ans", "wer\": ", "\"42\"}"]:
            a.feed({"choices": [{"index": 0, "delta": {"content": piece}}]})
        a.feed({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        self.assertEqual(a.result().content, "{\"answer\": \"42\"}")


class RequestTest(unittest.TestCase):
    def test_request_body(self):
        settings = LLMSettings(url="unix:/tmp/x.sock")
        tools = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]
        msgs = [{"role": "user", "content": "q"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "search", "arguments": {"query": "x"}}}]},
                {"role": "tool", "tool_call_id": "c1", "name": "search", "content": "r"}]
        body = build_request(settings, msgs, tools, seed=7)
        self.assertEqual(body["seed"], 7)
        self.assertTrue(body["stream"])
        self.assertEqual(body["stream_options"], {"include_usage": True})
        self.assertEqual(body["tool_choice"], "auto")
        self.assertEqual(body["messages"][1]["tool_calls"][0]["function"]["arguments"], "{\"query\": \"x\"}")
        self.assertNotIn("name", body["messages"][2])

    def test_endpoints(self):
        self.assertEqual(Endpoint.parse("unix:/tmp/s.sock").path, "/tmp/s.sock")
        e = Endpoint.parse("http://127.0.0.1:8765/v1")
        self.assertEqual((e.host, e.port, e.base), ("127.0.0.1", 8765, ""))
        with self.assertRaises(ValueError):
            Endpoint.parse("ftp://x")

    def test_retry_classification(self):
        self.assertTrue(RetryPolicy.retryable(LLMError("x", 0)))
        self.assertTrue(RetryPolicy.retryable(LLMError("x", 503)))
        self.assertTrue(RetryPolicy.retryable(LLMError("x", 429)))
        self.assertFalse(RetryPolicy.retryable(LLMError("x", 400)))

    def test_result_as_message(self):
        r = ChatResult(None, [], "stop")
        self.assertEqual(r.as_message(), {"role": "assistant", "content": None})


if __name__ == "__main__":
    unittest.main()
