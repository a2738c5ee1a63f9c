"""Commands, parsing and the environment of the agent-computer interface."""

import json
import sys
import tempfile
import unittest
from pathlib import Path

from swe.commands import (
    ArgumentValidationError,
    CommandRegistry,
    CommandSyntaxError,
    prepare_arguments,
    resolve_refs,
)
from swe.config import AgentConfig
from swe.environment import LintError, SWEEnvironment, ToolError
from swe.llm import ModelResponse, ToolCall
from swe.parsing import ActionParser, FormatError, extract_json_object


class CommandParsingTest(unittest.TestCase):
    def setUp(self):
        self.registry = CommandRegistry()

    def test_edit_reads_body_up_to_terminator(self):
        command, args = self.registry.parse_command_text("edit 3:4\n    x = {1: 2}\n    return x\nend_of_edit")
        self.assertEqual(command.name, "edit")
        self.assertEqual(args, {"start_line": "3", "end_line": "4", "replacement_text": "    x = {1: 2}\n    return x"})

    def test_edit_without_terminator_is_refused(self):
        with self.assertRaises(CommandSyntaxError):
            self.registry.parse_command_text("edit 3:4\n    x = 1")

    def test_two_commands_are_refused(self):
        with self.assertRaises(CommandSyntaxError):
            self.registry.parse_command_text("open a.py\nscroll_down")

    def test_quoted_search_term(self):
        command, args = self.registry.parse_command_text('search_dir "def mean" src')
        self.assertEqual(args, {"search_term": "def mean", "dir": "src"})

    def test_arguments_are_coerced_and_validated(self):
        command = self.registry.get("open")
        self.assertEqual(prepare_arguments(command, {"path": "a.py", "line_number": "7"}), {"path": "a.py", "line_number": 7})
        self.assertEqual(prepare_arguments(command, {"path": "a.py", "line_number": None}), {"path": "a.py"})
        with self.assertRaises(ArgumentValidationError):
            prepare_arguments(command, {"path": "a.py", "line_number": "seven"})
        with self.assertRaises(ArgumentValidationError):
            prepare_arguments(self.registry.get("run_tests"), {"verbosity": "loud"})
        with self.assertRaises(ArgumentValidationError):
            prepare_arguments(self.registry.get("run_tests"), {"test_ids": [1, 2]})

    def test_refs_are_inlined_and_cycles_terminate(self):
        schema = {
            "type": "object",
            "properties": {"node": {"$ref": "#/$defs/Node"}},
            "$defs": {"Node": {"type": "object", "properties": {"child": {"$ref": "#/$defs/Node"}}}},
        }
        resolved = resolve_refs(schema)
        self.assertNotIn("$ref", json.dumps(resolved))
        self.assertEqual(resolved["properties"]["node"]["properties"]["child"]["type"], "object")

    def test_tool_schemas_have_no_refs(self):
        text = json.dumps(self.registry.tool_schemas())
        self.assertNotIn("$ref", text)
        self.assertNotIn("$defs", text)


class ActionParserTest(unittest.TestCase):
    def setUp(self):
        self.parser = ActionParser(CommandRegistry(), "auto")

    def test_thought_and_fenced_command(self):
        action = self.parser.parse(ModelResponse("DISCUSSION\nLook first.\n\n```\nopen a.py 3\n```"))
        self.assertEqual((action.thought, action.command.name, action.source), ("Look first.", "open", "text"))

    def test_function_call(self):
        call = ToolCall("call_1", "goto", '{"line_number": 4}')
        action = self.parser.parse(ModelResponse("", [call], "tool_calls"))
        self.assertEqual((action.command.name, action.raw_arguments, action.call_id), ("goto", {"line_number": 4}, "call_1"))

    def test_json_action_plain_and_fenced(self):
        body = json.dumps({"thought": "t", "command": "scroll_down", "arguments": {}})
        for content in (body, f"```json\n{body}\n```", f"```\n{body}\n```"):
            self.assertEqual(self.parser.parse(ModelResponse(content)).command.name, "scroll_down")

    def test_missing_block_is_a_format_error(self):
        with self.assertRaises(FormatError):
            self.parser.parse(ModelResponse("I will open the file now."))

    def test_broken_arguments_are_a_format_error(self):
        with self.assertRaises(FormatError):
            self.parser.parse(ModelResponse("", [ToolCall("c", "open", '{"path": "a.py"')], "tool_calls"))

    def test_extract_json_skips_prose(self):
        self.assertEqual(extract_json_object('Here: {"a": {"b": 1}} done'), {"a": {"b": 1}})


class EnvironmentTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.repo = Path(self.tmp.name)
        (self.repo / "pkg").mkdir()
        (self.repo / "pkg" / "mod.py").write_text("def f(x):\n    return x\n", encoding="utf-8")
        (self.repo / "data.bin").write_bytes(b"\x00\xff\xfe")
        self.env = SWEEnvironment(self.repo, f"{sys.executable} -m unittest -q", AgentConfig())

    def tearDown(self):
        self.tmp.cleanup()

    def test_edit_and_diff(self):
        self.env.open_file("pkg/mod.py")
        self.env.edit(2, 2, "    return x + 1")
        diff = self.env.diff()
        self.assertIn("-    return x\n+    return x + 1\n", diff)
        self.assertTrue(diff.startswith("diff --git a/pkg/mod.py b/pkg/mod.py\n"))

    def test_syntax_error_rolls_back(self):
        self.env.open_file("pkg/mod.py")
        with self.assertRaises(LintError) as ctx:
            self.env.edit(2, 2, "return (x")
        self.assertIn("NOT been applied", str(ctx.exception))
        self.assertEqual((self.repo / "pkg" / "mod.py").read_text(), "def f(x):\n    return x\n")
        self.assertEqual(self.env.diff(), "")

    def test_paths_outside_the_repository_are_refused(self):
        with self.assertRaises(ToolError):
            self.env.open_file("../etc/passwd")

    def test_search_skips_binary_files(self):
        self.assertIn("pkg/mod.py (1 matches)", self.env.search_dir("return"))
        self.assertIn("Line 2:", self.env.search_file("return", "pkg/mod.py"))
        self.assertIn("pkg/mod.py", self.env.find_file("*.py"))

    def test_test_output_with_invalid_utf8_is_decoded(self):
        (self.repo / "test_bytes.py").write_text(
            "import sys, unittest\n"
            "class T(unittest.TestCase):\n"
            "    def test_dump(self):\n"
            "        sys.stdout.buffer.write(b'M\\xfcller\\n'); sys.stdout.flush()\n",
            encoding="utf-8",
        )
        out = self.env.run_tests()
        self.assertIn("M\ufffdller", out)
        self.assertIn("[tests passed]", out)
        self.assertNotIn(str(self.repo), out)
        self.assertRegex(out, r"Ran 1 test\n")

    def test_window(self):
        text = self.env.open_file("pkg/mod.py", 1)
        self.assertTrue(text.startswith("[File: pkg/mod.py (2 lines total)]"))
        with self.assertRaises(ToolError):
            self.env.goto(10)


if __name__ == "__main__":
    unittest.main()
