"""Streaming, tokens, history and tracing."""

import io
import json
import tempfile
import unittest
from pathlib import Path

from swe.history import ContextWindow, History, ObservationCompressor, Turn, to_messages
from swe.llm import LLMClient, StreamAssembler, iter_sse_data
from swe.tokens import TokenCounter
from swe.tracing import Tracer


class FakeResponse(io.BytesIO):
    pass


class StreamTest(unittest.TestCase):
    def test_sse_events_comments_and_done(self):
        raw = (
            ": keep-alive\n\n"
            'data: {"a": 1}\n\n'
            "data: line one\ndata: line two\n\n"
            "data: [DONE]\n\n"
            'data: {"after": "done"}\n\n'
        ).encode()
        self.assertEqual(list(iter_sse_data(FakeResponse(raw))), ['{"a": 1}', "line one\nline two"])

    def test_multibyte_text_split_across_chunks(self):
        payload = json.dumps({"choices": [{"delta": {"content": "Zoë 東京"}}]}, ensure_ascii=False)
        raw = f"data: {payload}\n\n".encode("utf-8")
        self.assertEqual(list(iter_sse_data(FakeResponse(raw))), [payload])

    def test_tool_call_arguments_are_concatenated_per_index(self):
        assembler = StreamAssembler()
        chunks = [
            {"choices": [{"delta": {"role": "assistant", "content": ""}}]},
            {"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "c0", "type": "function", "function": {"name": "open", "arguments": '{"pa'}}]}}]},
            {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": 'th": "a.py"'}}]}}]},
            {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "}"}}]}}]},
            {"choices": [{"delta": {}, "finish_reason": "tool_calls"}], "usage": None},
            {"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 4}},
        ]
        for chunk in chunks:
            assembler.feed(chunk)
        content, calls = assembler.message()
        self.assertEqual(json.loads(calls[0].arguments), {"path": "a.py"})
        self.assertEqual((calls[0].call_id, calls[0].name), ("c0", "open"))
        self.assertEqual(assembler.finish_reason, "tool_calls")
        self.assertEqual(assembler.usage["completion_tokens"], 4)

    def test_error_classification(self):
        body = json.dumps({"error": {"message": "maximum context length is 8192", "code": "context_length_exceeded"}}).encode()
        self.assertEqual(type(LLMClient._api_error(400, body)).__name__, "ContextWindowExceededError")
        self.assertEqual(type(LLMClient._api_error(400, b"{}")).__name__, "BadRequestError")
        self.assertEqual(type(LLMClient._api_error(503, b"busy")).__name__, "TransientModelError")


class TokenCounterTest(unittest.TestCase):
    def test_rule(self):
        counter = TokenCounter()
        cases = {"": 0, " \n\t": 0, "cats": 1, "catsz": 2, "hello, world!": 6, "Zürich": 2, "snake_case_name": 4}
        for text, expected in cases.items():
            self.assertEqual(counter.count_text(text), expected, text)

    def test_message_framing(self):
        counter = TokenCounter()
        messages = [{"role": "user", "content": "hi"}]
        self.assertEqual(counter.count_messages(messages), 3 + 1 + 1 + 3)


class HistoryTest(unittest.TestCase):
    def history(self, observations):
        history = History([Turn("system", "sys", "system"), Turn("user", "issue", "instance")])
        for i in range(observations):
            history.append(Turn("assistant", f"action {i}", "action", i + 1))
            history.append(Turn("user", f"output {i}\n" * 50, "observation", i + 1))
        return history

    def test_old_observations_collapse_and_latest_survives(self):
        turns, collapsed = ObservationCompressor(2).compress(self.history(5).turns)
        self.assertEqual(collapsed, 3)
        self.assertTrue(turns[-1].content.startswith("output 4"))
        turns, _ = ObservationCompressor(2).compress(self.history(5).turns, keep_last=0)
        self.assertTrue(turns[-1].content.startswith("output 4"))
        self.assertTrue(turns[3].content.startswith("Old environment output"))

    def test_window_keeps_system_issue_and_every_assistant_turn_when_possible(self):
        with tempfile.TemporaryDirectory() as tmp:
            tracer = Tracer(Path(tmp) / "t.jsonl", "swe")
            counter = TokenCounter()
            window = ContextWindow(counter, ObservationCompressor(5), 800, 100, 50, tracer)
            history = self.history(6)
            messages = window.fit(history, None)
            self.assertEqual(messages[0]["content"], "sys")
            self.assertEqual(messages[1]["content"], "issue")
            self.assertEqual(sum(m["role"] == "assistant" for m in messages), 6)
            self.assertLessEqual(counter.count_messages(messages), 650)
            tracer.flush()
            names = [json.loads(line)["name"] for line in (Path(tmp) / "t.jsonl").read_text().splitlines()]
            self.assertIn("context.truncate", names)

    def test_dropping_an_exchange_never_evicts_system_or_issue(self):
        turns = self.history(6).turns
        self.assertTrue(ContextWindow._drop_oldest_exchange(turns))
        self.assertEqual([t.kind for t in turns[:2]], ["system", "instance"])
        self.assertEqual(turns[2].content, "action 1")

    def test_tool_turns_keep_their_call_ids(self):
        turns = [
            Turn("assistant", "", "action", 1, tool_calls=[{"id": "c1", "name": "submit", "arguments": "{}"}]),
            Turn("tool", "done", "observation", 1, tool_call_id="c1"),
        ]
        messages = to_messages(turns)
        self.assertIsNone(messages[0]["content"])
        self.assertEqual(messages[1]["tool_call_id"], "c1")


class TracingTest(unittest.TestCase):
    def test_spans_carry_code_location_and_parents(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "trace.jsonl"
            tracer = Tracer(path, "swe")
            Tracer.set_step(3)
            with tracer.span("outer", "chain") as outer:
                with tracer.span("inner", "tool"):
                    pass
            with self.assertRaises(ValueError):
                with tracer.span("failing", "chain"):
                    raise ValueError("boom")
            tracer.flush()
            spans = [json.loads(line) for line in path.read_text().splitlines()]
        self.assertEqual([s["name"] for s in spans], ["outer", "inner", "failing"])
        self.assertEqual(spans[1]["parent_span_id"], outer.span_id)
        attrs = spans[0]["attributes"]
        self.assertEqual(attrs["code.filepath"], "tests/test_model_io.py")
        self.assertEqual(attrs["code.function"], "TracingTest.test_spans_carry_code_location_and_parents")
        self.assertEqual(attrs["pathfinder.step_index"], 3)
        self.assertEqual(spans[2]["status"]["code"], "ERROR")
        self.assertEqual(spans[2]["attributes"]["error.type"], "ValueError")


if __name__ == "__main__":
    unittest.main()
