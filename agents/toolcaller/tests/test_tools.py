"""Tools, schemas, parsing and token counting."""

import json
import os
import tempfile
import unittest

from toolcaller import schema
from toolcaller.parsing import extract_json, parse_final_answer, parse_arguments
from toolcaller.tokens import ContextWindow, count_prompt, count_tokens
from toolcaller.history import summarize_text
from toolcaller.tools import ToolContext, default_registry
from toolcaller.tools.base import ToolError, validate_arguments, format_output
from toolcaller.tools.calculator import evaluate, format_number


def corpus():
    d = tempfile.mkdtemp()
    os.makedirs(os.path.join(d, "town"))
    os.makedirs(os.path.join(d, "tables"))
    with open(os.path.join(d, "town", "tower.md"), "w", encoding="utf-8") as f:
        f.write("# The Tower\n\nThe tower was designed by Zoë Marchetti in 1871.\nIt is 38 metres tall.\n")
    with open(os.path.join(d, "town", "latin1.md"), "wb") as f:
        f.write("# Caf\xe9\n\nna\xefve bytes\n".encode("latin-1"))
    with open(os.path.join(d, "tables", "people.csv"), "w", encoding="utf-8") as f:
        f.write("name,age,town\nAda,36,Old Quay\nBen,41,Hillside\nCy,29,Old Quay\n")
    return d


class SchemaTest(unittest.TestCase):
    def test_unions_optionals_enums_arrays_refs(self):
        s = default_registry().get("table_lookup").parameters
        ok = {"table": "t", "where": [{"column": "a", "op": "=", "value": 3}], "limit": None}
        self.assertEqual(schema.validate(ok, s), [])
        errors = schema.validate({"table": 1, "where": [{"column": "a", "op": "~", "value": []}]}, s)
        self.assertTrue(any("$.table: expected string" in e for e in errors), errors)
        self.assertTrue(any("'~' is not one of" in e for e in errors), errors)
        self.assertTrue(any("$.where[0].value" in e for e in errors), errors)
        self.assertTrue(schema.validate({"table": "t", "extra": 1}, s))
        self.assertTrue(schema.validate({}, s))

    def test_booleans_are_not_integers(self):
        self.assertTrue(schema.validate(True, {"type": "integer"}))
        self.assertEqual(schema.validate(3, {"type": ["integer", "null"]}), [])

    def test_bad_ref_is_a_schema_error(self):
        with self.assertRaises(schema.SchemaError):
            schema.validate(1, {"$ref": "#/$defs/nope"})

    def test_validation_applies_defaults(self):
        tool = default_registry().get("search")
        self.assertEqual(validate_arguments(tool, {"query": "x"})["top_k"], 3)
        with self.assertRaises(ToolError):
            validate_arguments(tool, {"query": "x", "top_k": "3"})


class ToolsTest(unittest.TestCase):
    def setUp(self):
        self.ctx = ToolContext(corpus_dir=corpus())
        self.tools = default_registry()

    def test_search_folds_diacritics(self):
        out = self.tools.get("search").run({"query": "zoe marchetti"}, self.ctx)
        self.assertIn("town/tower.md", out)
        self.assertIn("Zoë Marchetti", out)

    def test_read_file_replaces_undecodable_bytes(self):
        out = self.tools.get("read_file").run({"path": "town/latin1.md"}, self.ctx)
        self.assertIn("\ufffd", out)
        with self.assertRaises(ToolError):
            self.tools.get("read_file").run({"path": "../../etc/passwd"}, self.ctx)

    def test_table_lookup(self):
        t = self.tools.get("table_lookup")
        out = t.run({"table": "people", "where": [{"column": "town", "op": "=", "value": "old quay"}],
                     "columns": ["name"]}, self.ctx)
        self.assertEqual(out, "name\nAda\nCy\n(2 rows)")
        out = t.run({"table": "people", "aggregate": {"function": "sum", "column": "age"}}, self.ctx)
        self.assertEqual(out, "sum(age) = 106 over 3 rows")
        out = t.run({"table": "people", "order_by": "age", "descending": True, "limit": 1}, self.ctx)
        self.assertIn("Ben", out)
        with self.assertRaises(ToolError):
            t.run({"table": "nope"}, self.ctx)

    def test_calculator(self):
        self.assertEqual(format_number(evaluate("0.1 + 0.2")), "0.3")
        self.assertEqual(format_number(evaluate("round(12400000 / 86)")), "144186")
        self.assertEqual(format_number(evaluate("2 ^ 10")), "1024")
        for bad in ("__import__('os')", "1/0", "9 ** 999", "x + 1"):
            with self.assertRaises(ToolError, msg=bad):
                evaluate(bad)

    def test_output_is_cut_with_a_note(self):
        out = format_output("x" * 5000, limit=100)
        self.assertTrue(out.startswith("x" * 100) and "4900 more characters" in out)


class ParsingTest(unittest.TestCase):
    def test_json_in_markdown(self):
        self.assertEqual(extract_json('```json\n{"answer": 1}\n```'), {"answer": 1})
        self.assertEqual(extract_json('```\n{"answer": 1}\n```'), {"answer": 1})
        self.assertEqual(extract_json('Sure.\n\n{"answer": "x"} done'), {"answer": "x"})
        self.assertIsNone(extract_json("no json here"))

    def test_final_answers(self):
        self.assertEqual(parse_final_answer('{"answer": 1871}'), "1871")
        self.assertEqual(parse_final_answer('{"answer": 64.5}'), "64.5")
        self.assertEqual(parse_final_answer('{"answer": 3.0}'), "3")
        self.assertEqual(parse_final_answer('Final Answer: Marta  Quell\nbecause'), "Marta Quell")
        self.assertEqual(parse_final_answer('{"answer": "Zoe\u0308"}'), "Zo\u00eb")
        self.assertIsNone(parse_final_answer("I think it is 42."))

    def test_arguments(self):
        self.assertEqual(parse_arguments(""), {})
        with self.assertRaises(ValueError):
            parse_arguments('{"query": ')
        with self.assertRaises(ValueError):
            parse_arguments("[1]")


class TokensTest(unittest.TestCase):
    def test_counts_match_the_contract(self):
        self.assertEqual(count_tokens("hello, world!"), 6)
        self.assertEqual(count_tokens('{"a":1}'), 7)
        self.assertEqual(count_tokens("Zürich"), 2)
        self.assertEqual(count_tokens("snake_case_name"), 4)
        self.assertEqual(count_prompt([{"role": "user", "content": "hi"}]), 3 + 3 + 1 + 1)

    def test_window_summarises_then_elides_but_keeps_every_turn(self):
        msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]
        for i in range(6):
            msgs.append({"role": "assistant", "content": None, "tool_calls": [
                {"id": f"c{i}", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}]})
            msgs.append({"role": "tool", "tool_call_id": f"c{i}", "content": "word " * 400})
        window = ContextWindow(limit=1500, reserve=200, clip_chars=300)
        fitted, report = window.fit(msgs, None, summarize_text)
        self.assertLessEqual(count_prompt(fitted), 1300)
        self.assertGreater(report["summarized"], 0)
        self.assertEqual(fitted[:2], msgs[:2])
        self.assertEqual([m["role"] for m in fitted], [m["role"] for m in msgs])
        self.assertEqual(fitted[-1], msgs[-1])
        tight, report = ContextWindow(limit=800, reserve=200, clip_chars=300).fit(msgs, None, summarize_text)
        self.assertGreater(report["elided"], 0)
        self.assertLessEqual(count_prompt(tight), 600)
        self.assertEqual(len(tight), len(msgs))
        # Every remaining tool result still answers an assistant tool call before it.
        ids = set()
        for m in fitted:
            for c in m.get("tool_calls") or []:
                ids.add(c["id"])
            if m["role"] == "tool":
                self.assertIn(m["tool_call_id"], ids)


if __name__ == "__main__":
    unittest.main()
