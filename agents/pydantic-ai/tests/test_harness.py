"""The harness's own parts: answers, context fitting, tool schemas, the trace contract.

Run from agents/pydantic-ai with the vendored dependencies on the path:
`PYTHONPATH=.site python3 -m unittest discover -s tests -t .`
"""

import json
import os
import tempfile
import unittest

from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, ToolCallPart, ToolReturnPart, UserPromptPart

from pydantic_ai_tasks import agent, context, tools, tracing


class Answers(unittest.TestCase):
    def test_json_fenced_and_prose_answers(self):
        self.assertEqual(agent.parse_answer('{"answer": 1871}'), "1871")
        self.assertEqual(agent.parse_answer('```json\n{"answer": "Marta  Quell"}\n```'), "Marta Quell")
        self.assertEqual(agent.parse_answer('It is 4.\n\n{"answer": 4.0}'), "4")
        self.assertIsNone(agent.parse_answer("The answer is 1871."))
        self.assertIsNone(agent.parse_answer(None))

    def test_outcomes(self):
        self.assertEqual(agent.outcome_from('{"answer": "x"}', 3).status, "completed")
        self.assertEqual(agent.outcome_from('{"answer": "unknown"}', 3).status, "gave_up")
        self.assertEqual(agent.outcome_from("no idea", 3).status, "failed")

    def test_the_validator_asks_again_without_an_answer(self):
        from pydantic_ai import ModelRetry

        self.assertEqual(agent.require_answer('{"answer": 2}'), '{"answer": 2}')
        with self.assertRaises(ModelRetry):
            agent.require_answer("I think it is 2.")

    def test_the_prompts_show_the_answer_object_and_when_to_give_it(self):
        system = agent.system_prompt("search, read_file")
        self.assertIn('{"answer": "..."}', system)
        self.assertIn("When you know the answer", system)
        self.assertIn("search, read_file", system)
        self.assertEqual(system.count("You are"), 1)
        self.assertIn('{"answer": ...}', agent.task_message("When?"))


class Context(unittest.TestCase):
    def test_tokens_are_counted_as_the_contract_says(self):
        # "hello" 2, "," 1, "world" 2, "12345678" 2
        self.assertEqual(context.count_text("hello, world 12345678"), 7)

    def _history(self, long: str, rounds: int) -> list:
        messages = [ModelRequest(parts=[UserPromptPart("Question: when?")])]
        for i in range(rounds):
            messages.append(ModelResponse(parts=[ToolCallPart("read_file", {"path": f"d{i}.md"}, tool_call_id=f"c{i}")]))
            messages.append(ModelRequest(parts=[ToolReturnPart("read_file", long, tool_call_id=f"c{i}")]))
        return messages

    def test_old_tool_results_shrink_first_and_every_turn_stays(self):
        long = "line of a document with facts 1871\n" * 300
        messages = self._history(long, 3)
        out = context.fit_history(messages, 1024)
        self.assertEqual(len(out), len(messages))
        self.assertEqual([type(m) for m in out], [type(m) for m in messages])
        self.assertIs(out[-1], messages[-1], "the result the model answers now is kept whole")
        self.assertIs(out[0], messages[0], "the task is kept")
        budget = context.WINDOW - 1024 - context.RESERVE
        self.assertLessEqual(sum(map(context.count_message, out)), budget)
        self.assertNotEqual(out[2].parts[0].content, long, "the oldest result goes first")
        self.assertEqual(messages[2].parts[0].content, long, "the history given is not changed")

    def test_a_history_that_fits_is_left_alone(self):
        messages = [ModelRequest(parts=[UserPromptPart("Question: when?")]), ModelResponse(parts=[TextPart("soon")])]
        self.assertEqual(context.fit_history(messages, 1024), messages)


class Tools(unittest.TestCase):
    def test_pydantic_ai_builds_the_schemas_from_the_docstrings(self):
        from pydantic_ai.tools import Tool

        search = Tool(tools.search).tool_def
        self.assertTrue(search.description.startswith("Search the document corpus."))
        props = search.parameters_json_schema["properties"]
        self.assertEqual(props["query"]["description"], "Keywords to look for.")
        self.assertEqual(search.parameters_json_schema["required"], ["query"])
        lookup = Tool(tools.table_lookup).tool_def.parameters_json_schema
        self.assertIn("where", lookup["properties"])

    def test_a_refusal_is_a_retry_for_the_model(self):
        from pydantic_ai import ModelRetry

        with tempfile.TemporaryDirectory() as tmp:
            os.environ["PATHFINDER_CORPUS"] = tmp
            try:
                with self.assertRaises(ModelRetry) as caught:
                    tools.read_file("nowhere.md")
            finally:
                os.environ.pop("PATHFINDER_CORPUS")
        self.assertIn("no file 'nowhere.md'", str(caught.exception))
        self.assertEqual(tools.calculator("(3120 + 4480) * 1.5"), "11400")


class Trace(unittest.TestCase):
    def test_spans_become_contract_lines(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "trace.jsonl")
            provider, writer = tracing.provider(path)
            tracer = provider.get_tracer("test")
            with tracer.start_as_current_span("agent.run") as root:
                root.set_attribute("gen_ai.agent.name", "pydantic-ai")
                with tracer.start_as_current_span("invoke_agent assistant") as run:
                    run.set_attribute("gen_ai.operation.name", "invoke_agent")
                    run.set_attribute("gen_ai.agent.name", "assistant")
                    with tracer.start_as_current_span("execute_tool read_file") as tool:
                        tool.set_attribute("gen_ai.operation.name", "execute_tool")
                        tool.set_attribute("gen_ai.tool.name", "read_file")
                        tool.set_attribute("gen_ai.tool.call.arguments", '{"path": "x"}')
                        tool.set_attribute("gen_ai.tool.call.result", "# x")
                    try:
                        with tracer.start_as_current_span("chat pathfinder-scripted") as llm:
                            llm.set_attribute("gen_ai.operation.name", "chat")
                            llm.set_attribute("gen_ai.input.messages", "[]")
                            raise ValueError("bad request")
                    except ValueError:
                        pass
            writer.shutdown()
            with open(path, encoding="utf-8") as f:
                lines = [json.loads(line) for line in f]
        by_name = {line["name"]: line for line in lines}
        tool = by_name["execute_tool read_file"]
        self.assertEqual(tool["kind"], "tool")
        self.assertEqual(tool["attributes"]["gen_ai.agent.name"], "assistant", "inherited from the run span")
        self.assertEqual(tool["attributes"]["input.value"], '{"path": "x"}')
        self.assertEqual(tool["attributes"]["output.value"], "# x")
        llm = by_name["chat pathfinder-scripted"]
        self.assertEqual((llm["kind"], llm["status"]["code"]), ("llm", "ERROR"))
        self.assertEqual(llm["attributes"]["error.type"], "ValueError")
        self.assertEqual(llm["attributes"]["exception.message"], "bad request")
        self.assertEqual(by_name["invoke_agent assistant"]["kind"], "agent")
        self.assertEqual(by_name["agent.run"]["kind"], "agent")
        self.assertIsNone(by_name["agent.run"]["parent_span_id"])
        for line in lines:
            for key in ("code.filepath", "code.function", "code.lineno", "gen_ai.agent.name",
                        "pathfinder.step_index"):
                self.assertIn(key, line["attributes"], line["name"])
            self.assertEqual(len(line["trace_id"]), 32)


if __name__ == "__main__":
    unittest.main()
