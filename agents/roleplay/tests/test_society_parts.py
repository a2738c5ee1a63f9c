"""Prompts, events, the board, streaming, memory and JSON extraction."""

import asyncio
import io
import json
import unittest

from roleplay.blackboard import Blackboard, Note
from roleplay.events import EventBus
from roleplay.jsonutil import JSONExtractionError, extract_json
from roleplay.memory import ChatHistoryMemory, ContextCreator, MemoryRecord
from roleplay.messages import BackendRole, BaseMessage, RoleType, ToolCallRequest
from roleplay.models import ChunkAccumulator, sse_events
from roleplay.prompts import PromptError, TextPrompt
from roleplay.roles import default_cast, role_prompt_templates
from roleplay.tokens import TokenCounter


class PromptTest(unittest.TestCase):
    def test_two_pass_rendering_keeps_braces_literal(self):
        template = TextPrompt('Role {role}. Plan: {plan}. Reply {{"ok": true}}.')
        first = template.format(role="analyst")
        self.assertEqual(first.key_words, {"plan"})
        second = first.format(plan=json.dumps({"steps": ["{x}"]}))
        self.assertEqual(second.render(), 'Role analyst. Plan: {"steps": ["{x}"]}. Reply {"ok": true}.')

    def test_unfilled_placeholder_is_an_error(self):
        with self.assertRaises(PromptError):
            TextPrompt("Hello {name}").render()

    def test_role_prompts_render_with_json_plan(self):
        templates = role_prompt_templates(default_cast())
        plan = json.dumps({"specified_task": "t", "subgoals": ["a {b}"]})
        text = templates[RoleType.ASSISTANT].format(task="Find X", plan=plan, answer_format="n").render()
        self.assertIn("Corpus Analyst", text)
        self.assertIn(plan, text)
        self.assertIn('{"final_answer": "<value>"', text)


class EventsAndBoardTest(unittest.TestCase):
    def test_one_shot_handlers_and_wait_for(self):
        async def scenario():
            bus = EventBus()
            calls = []
            bus.subscribe("e", lambda p: calls.append(("always", p)))
            bus.subscribe("e", lambda p: calls.append(("once", p)), once=True)
            future = bus.wait_for("e", lambda p: p == 2)
            await bus.emit("e", 1)
            await bus.emit("e", 2)
            return calls, await future, bus.handler_count("e")

        calls, value, remaining = asyncio.run(scenario())
        self.assertEqual(calls, [("always", 1), ("once", 1), ("always", 2)])
        self.assertEqual((value, remaining), (2, 1))

    def test_concurrent_posts_land_in_key_order(self):
        async def scenario():
            board = Blackboard(EventBus())

            async def post(key, delay):
                await asyncio.sleep(delay)
                await board.post(Note(key, "fact", "a", f"fact {key}"))

            await asyncio.gather(post((1, 0, 1), 0.0), post((1, 0, 0), 0.01), post((0, 0, 0), 0.005))
            return board

        board = asyncio.run(scenario())
        self.assertEqual([n.key for n in board.notes("fact")], [(0, 0, 0), (1, 0, 0), (1, 0, 1)])

    def test_relevant_facts(self):
        async def scenario():
            board = Blackboard(EventBus())
            await board.post(Note((1, 0, 0), "fact", "a", "The lighthouse was lit in 1871", "read_file(history)"))
            await board.post(Note((1, 0, 1), "fact", "a", "Bread is baked at 04:00", "read_file(about)"))
            return board.relevant("When was the lighthouse lit?", k=1)

        chosen = asyncio.run(scenario())
        self.assertEqual([n.text for n in chosen], ["The lighthouse was lit in 1871"])


class StreamTest(unittest.TestCase):
    def test_events_survive_split_reads_and_multibyte_characters(self):
        payload = json.dumps({"choices": [{"delta": {"content": "Zoë 東京"}}]}, ensure_ascii=False)
        raw = (": keep-alive\n\n" + f"data: {payload}\n\n" + "data: [DONE]\n\n").encode("utf-8")
        stream = io.BytesIO(raw)
        events = list(sse_events(lambda n: stream.read(3)))
        self.assertEqual([json.loads(e)["choices"][0]["delta"]["content"] for e in events], ["Zoë 東京"])

    def test_tool_call_fragments_are_joined(self):
        acc = ChunkAccumulator()
        acc.add({"choices": [{"delta": {"tool_calls": [{"index": 1, "id": "b", "function": {"name": "calculator", "arguments": '{"expr'}}]}}]})
        acc.add({"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "a", "function": {"name": "search", "arguments": ""}}]}}]})
        acc.add({"choices": [{"delta": {"tool_calls": [{"index": 1, "function": {"arguments": 'ession": "1+1"}'}}]}}]})
        acc.add({"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"query": "x"}'}}]}}]})
        acc.add({"choices": [{"delta": {}, "finish_reason": "tool_calls"}], "usage": None})
        calls = acc.tool_calls()
        self.assertEqual([c.call_id for c in calls], ["a", "b"])
        self.assertEqual(json.loads(calls[1].arguments), {"expression": "1+1"})
        self.assertIsNone(acc.usage)


class MemoryTest(unittest.TestCase):
    def records(self):
        memory = ChatHistoryMemory()
        memory.write_record(MemoryRecord(BaseMessage("s", RoleType.ASSISTANT, "system rules"), BackendRole.SYSTEM, 0))
        for turn in range(1, 4):
            memory.write_record(MemoryRecord(BaseMessage("u", RoleType.USER, f"instruction {turn}"), BackendRole.USER, turn))
            call = ToolCallRequest(f"c{turn}", "read_file", "{}")
            memory.write_record(MemoryRecord(BaseMessage("a", RoleType.ASSISTANT, "", tool_calls=[call]), BackendRole.ASSISTANT, turn))
            memory.write_record(MemoryRecord(BaseMessage("a", RoleType.ASSISTANT, "word " * 300, tool_call_id=f"c{turn}"), BackendRole.TOOL, turn))
        return memory.retrieve()

    def test_within_limit_is_unchanged(self):
        messages, tokens = ContextCreator(TokenCounter(), 100000).create_context(self.records(), None)
        self.assertEqual(len(messages), 10)

    def test_old_tool_results_are_compacted_first(self):
        messages, tokens = ContextCreator(TokenCounter(), 700).create_context(self.records(), None)
        self.assertEqual(len(messages), 10)
        tool_contents = [m["content"] for m in messages if m["role"] == "tool"]
        self.assertIn("compacted", tool_contents[0])
        self.assertNotIn("compacted", tool_contents[-1])
        self.assertLessEqual(tokens, 700)

    def test_dropping_keeps_system_and_pairs(self):
        messages, tokens = ContextCreator(TokenCounter(), 450).create_context(self.records(), None)
        self.assertEqual(messages[0]["role"], "system")
        for i, m in enumerate(messages):
            if m["role"] == "tool":
                self.assertIn("tool_calls", messages[i - 1])
        self.assertLessEqual(tokens, 450)


class JSONExtractionTest(unittest.TestCase):
    def test_fenced_bare_and_prose(self):
        body = '{"final_answer": "42", "evidence": "a {b}"}'
        for text in (body, f"```json\n{body}\n```", f"```\n{body}\n```", f"Here it is: {body} done"):
            self.assertEqual(extract_json(text)["final_answer"], "42")
        with self.assertRaises(JSONExtractionError):
            extract_json("no json here {")


if __name__ == "__main__":
    unittest.main()
