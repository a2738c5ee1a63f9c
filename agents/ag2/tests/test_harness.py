"""The harness's own parts: answers, context fitting, the trace contract, offline tokenisers.

Run from agents/ag2 with the vendored dependencies on the path:
`PYTHONPATH=.site python3 -m unittest discover -s tests -t .`
"""

import json
import os
import socket
import tempfile
import unittest
from unittest import mock

from ag2_tasks import chats, context, offline, patterns, tracing


class Answers(unittest.TestCase):
    def test_json_fenced_and_prose_answers(self):
        self.assertEqual(chats.parse_answer('{"answer": 1871}'), "1871")
        self.assertEqual(chats.parse_answer('```json\n{"answer": "Marta  Quell"}\n```'), "Marta Quell")
        self.assertEqual(chats.parse_answer('It is 4.\n\n{"answer": 4.0}'), "4")
        self.assertIsNone(chats.parse_answer("The answer is 1871."))
        self.assertIsNone(chats.parse_answer(None))

    def test_outcome_of_a_chat(self):
        done = chats.outcome_from([{"role": "assistant", "name": "writer", "content": '{"answer": "x"}'}], "writer")
        self.assertEqual((done.status, done.answer), ("completed", "x"))
        gave_up = chats.outcome_from([{"name": "writer", "content": '{"answer": "unknown"}'}], "writer")
        self.assertEqual(gave_up.status, "gave_up")
        failed = chats.outcome_from([{"name": "writer", "content": "no idea"}], "writer")
        self.assertEqual(failed.status, "failed")

    def test_tasks_are_dealt_round_the_patterns(self):
        seen = {patterns.pattern_for(f"gaia-{n:03}") for n in range(1, 7)}
        self.assertEqual(seen, set(patterns.PATTERN_NAMES))


class Context(unittest.TestCase):
    def test_tokens_are_counted_as_the_contract_says(self):
        # "hello" 2, "," 1, "world" 2, "12345678" 2
        self.assertEqual(context.count_text("hello, world 12345678"), 7)
        tool = {"role": "tool", "tool_responses": [{"tool_call_id": "a", "role": "tool", "content": "abcd"}],
                "content": "abcd"}
        # Sent as one tool message: 3 + role + id + content, not the combined content twice.
        self.assertEqual(context.count_message(tool), 3 + 1 + 1 + 1)

    def _agent(self):
        agent = mock.Mock()
        agent._oai_system_message = [{"role": "system", "content": "be brief"}]
        agent.llm_config = {}
        return agent

    def test_old_tool_results_shrink_first_and_every_turn_stays(self):
        long = "line of a document with facts 1871\n" * 400
        messages = [{"role": "user", "content": "Question: when?"}]
        for i in range(3):
            messages.append({"role": "assistant", "content": None,
                             "tool_calls": [{"id": f"c{i}", "function": {"name": "read_file", "arguments": "{}"}}]})
            messages.append({"role": "tool", "content": long,
                             "tool_responses": [{"tool_call_id": f"c{i}", "role": "tool", "content": long}]})
        transform = context.ElideOldToolResults(self._agent(), completion_tokens=1024)
        out = transform.apply_transform(messages)
        self.assertEqual(len(out), len(messages))
        self.assertEqual([m["role"] for m in out], [m["role"] for m in messages])
        self.assertEqual(out[-1], messages[-1], "the result the model answers now is kept whole")
        self.assertEqual(out[0], messages[0], "the task is kept")
        self.assertLessEqual(sum(map(context.count_message, out)), transform.budget())
        self.assertNotEqual(out[2]["content"], long, "the oldest result goes first")
        self.assertEqual(messages[2]["content"], long, "the agent's own history is not changed")

    def test_a_prompt_that_fits_is_left_alone(self):
        messages = [{"role": "user", "content": "Question: when?"}, {"role": "assistant", "content": "soon"}]
        self.assertEqual(context.ElideOldToolResults(self._agent(), 1024).apply_transform(messages), messages)


class Trace(unittest.TestCase):
    def test_spans_become_contract_lines(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "trace.jsonl")
            provider, writer = tracing.provider(path)
            tracer = provider.get_tracer("test")
            with tracer.start_as_current_span("agent.run") as root:
                root.set_attribute("gen_ai.agent.name", "ag2")
                with tracer.start_as_current_span("invoke_agent assistant") as reply:
                    reply.set_attribute("ag2.span.type", "agent")
                    reply.set_attribute("gen_ai.agent.name", "assistant")
                    with tracer.start_as_current_span("execute_tool search") as tool:
                        tool.set_attribute("ag2.span.type", "tool")
                        tool.set_attribute("gen_ai.tool.call.arguments", '{"query": "x"}')
                        tool.set_attribute("gen_ai.tool.call.result", "Error: no documents")
                        tool.set_attribute("error.type", "ExecutionError")
                    try:
                        with tracer.start_as_current_span("chat model") as llm:
                            llm.set_attribute("ag2.span.type", "llm")
                            llm.set_attribute("gen_ai.input.messages", "[]")
                            raise ValueError("bad request")
                    except ValueError:
                        pass
            writer.shutdown()
            with open(path, encoding="utf-8") as f:
                lines = [json.loads(line) for line in f]
        by_name = {line["name"]: line for line in lines}
        tool = by_name["execute_tool search"]
        self.assertEqual(tool["kind"], "tool")
        self.assertEqual(tool["status"]["code"], "ERROR")
        self.assertEqual(tool["attributes"]["gen_ai.agent.name"], "assistant", "inherited from the reply span")
        self.assertEqual(tool["attributes"]["input.value"], '{"query": "x"}')
        llm = by_name["chat model"]
        self.assertEqual((llm["kind"], llm["status"]["code"]), ("llm", "ERROR"))
        self.assertEqual(llm["attributes"]["error.type"], "ValueError")
        self.assertEqual(llm["attributes"]["exception.message"], "bad request")
        self.assertEqual(by_name["agent.run"]["kind"], "agent")
        self.assertIsNone(by_name["agent.run"]["parent_span_id"])
        for line in lines:
            for key in ("code.filepath", "code.function", "code.lineno", "gen_ai.agent.name",
                        "pathfinder.step_index"):
                self.assertIn(key, line["attributes"], line["name"])
            self.assertEqual(len(line["trace_id"]), 32)


class Offline(unittest.TestCase):
    def test_the_tokeniser_loads_without_the_network(self):
        with mock.patch.dict(os.environ, {}, clear=False):
            os.environ.pop("TIKTOKEN_CACHE_DIR", None)
            offline.use_bundled_tokenisers()
            self.assertIn("TIKTOKEN_CACHE_DIR", os.environ)

            def refuse(*args, **kwargs):
                raise AssertionError("tiktoken tried the network")

            with mock.patch.object(socket.socket, "connect", refuse):
                import tiktoken

                self.assertEqual(tiktoken.get_encoding("cl100k_base").encode("hello world"), [15339, 1917])


if __name__ == "__main__":
    unittest.main()
