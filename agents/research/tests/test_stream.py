import json
import unittest

from research.llm.stream import StreamAssembler, StreamError, sse_events
from research.llm.transport import Endpoint
from research.config import ConfigError


def chunk(delta=None, finish=None, usage=None, choices=True):
    body = {"object": "chat.completion.chunk"}
    body["choices"] = [{"index": 0, "delta": delta or {}, "finish_reason": finish}] if choices else []
    if usage:
        body["usage"] = usage
    return json.dumps(body)


class SSETest(unittest.TestCase):
    def test_events_skip_comments_and_join_lines(self):
        raw = [b": keep-alive\n", b"\n", b"data: a\n", b"data: b\r\n", b"\n", b"event: x\n",
               b"data: [DONE]\n", b"\n"]
        self.assertEqual(list(sse_events(raw)), ["a\nb", "[DONE]"])


class AssemblerTest(unittest.TestCase):
    def test_split_tool_call_arguments_and_usage(self):
        asm = StreamAssembler()
        asm.feed_data(chunk({"role": "assistant"}))
        asm.feed_data(chunk({"tool_calls": [{"index": 0, "id": "c1", "function":
                                             {"name": "search", "arguments": ""}}]}))
        for piece in ['{"qu', 'ery": "Zo', 'ë"}']:
            asm.feed_data(chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}))
        asm.feed_data(chunk({"tool_calls": [{"index": 1, "id": "c2", "function":
                                             {"name": "calculator", "arguments": "{}"}}]}))
        asm.feed_data("{not json")
        asm.feed_data(chunk(finish="tool_calls"))
        asm.feed_data(chunk(choices=False, usage={"prompt_tokens": 10, "completion_tokens": 4}))
        asm.feed_data("[DONE]")
        done = asm.finish()
        self.assertEqual([(c.id, c.name, c.arguments) for c in done.tool_calls],
                         [("c1", "search", '{"query": "Zoë"}'), ("c2", "calculator", "{}")])
        self.assertIsNone(done.content)
        self.assertEqual(done.usage["completion_tokens"], 4)
        self.assertEqual(done.malformed_chunks, 1)

    def test_content_pieces(self):
        asm = StreamAssembler()
        for piece in ["Final ", "answer: ", "42"]:
            asm.feed_data(chunk({"content": piece}))
        asm.feed_data(chunk(finish="length"))
        done = asm.finish()
        self.assertEqual((done.content, done.finish_reason), ("Final answer: 42", "length"))

    def test_stream_without_end_is_incomplete(self):
        asm = StreamAssembler()
        asm.feed_data(chunk({"content": "partial"}))
        with self.assertRaises(StreamError):
            asm.finish()

    def test_error_event(self):
        with self.assertRaisesRegex(StreamError, "overloaded"):
            StreamAssembler().feed_data(json.dumps({"error": {"message": "overloaded"}}))


class EndpointTest(unittest.TestCase):
    def test_parse(self):
        self.assertEqual(Endpoint.parse("http://127.0.0.1:8080").chat_path, "/v1/chat/completions")
        self.assertEqual(Endpoint.parse("http://h:1/api/v1/").chat_path, "/api/v1/chat/completions")
        unix = Endpoint.parse("unix:/tmp/llm.sock")
        self.assertEqual((unix.scheme, unix.socket_path), ("unix", "/tmp/llm.sock"))
        for bad in ["ftp://x", "unix:relative.sock", "localhost:80", "http://h:notaport"]:
            with self.assertRaises(ConfigError, msg=bad):
                Endpoint.parse(bad)


if __name__ == "__main__":
    unittest.main()
