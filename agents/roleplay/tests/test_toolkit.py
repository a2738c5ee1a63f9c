"""Schemas, validation and the corpus tools."""

import asyncio
import json
import tempfile
import unicodedata
import unittest
from pathlib import Path

from roleplay.messages import ToolCallRequest
from roleplay.toolkit import ArgumentError, CorpusToolkit, ToolError, Toolkit, ToolExecutor, function_schema


def make_corpus(root: Path) -> None:
    (root / "town").mkdir()
    (root / "tables").mkdir()
    (root / "town" / "history.md").write_text("# History\n\nThe lighthouse was completed in 1871.\nThe ferry began in 1858.\n", encoding="utf-8")
    (root / "town" / "lighthouse.md").write_text("# Lighthouse\n\nThe lighthouse keeper lit the lighthouse lamp.\n", encoding="utf-8")
    (root / "town" / "designer.md").write_text(unicodedata.normalize("NFD", "Designed by Zoë Marchetti.\n"), encoding="utf-8")
    (root / "tables" / "notes.md").write_text("lighthouse lighthouse lighthouse\n", encoding="utf-8")
    (root / "tables" / "products.csv").write_text("sku,name,price\nA-1,Aster,64.50\nB-2,Borealis Mini,39.95\n", encoding="utf-8")


class SchemaTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        make_corpus(Path(self.tmp.name))
        self.corpus = CorpusToolkit(Path(self.tmp.name))
        self.toolkit = Toolkit([self.corpus.search, self.corpus.read_file, self.corpus.table_lookup, self.corpus.calculator])

    def tearDown(self):
        self.tmp.cleanup()

    def test_schema_shapes(self):
        lookup = function_schema(self.corpus.table_lookup)["parameters"]
        self.assertEqual(lookup["required"], ["table"])
        self.assertEqual(lookup["properties"]["match"]["enum"], ["exact", "contains"])
        self.assertEqual(lookup["properties"]["where"]["anyOf"][0], {"$ref": "#/$defs/ColumnFilter"})
        self.assertEqual(lookup["properties"]["columns"]["anyOf"][0], {"type": "array", "items": {"type": "string"}})
        value = lookup["$defs"]["ColumnFilter"]["properties"]["value"]
        self.assertEqual(value["anyOf"], [{"type": "string"}, {"type": "number"}])
        limit = function_schema(self.corpus.search)["parameters"]["properties"]["limit"]["anyOf"][0]
        self.assertEqual((limit["minimum"], limit["maximum"]), (1, 10))

    def test_validation(self):
        tool = self.toolkit.get("table_lookup")
        self.assertEqual(tool.parse_arguments('{"table": "products", "where": {"column": "price", "value": 64.5}}')["where"]["value"], 64.5)
        self.assertEqual(tool.parse_arguments('{"table": "products", "columns": null}'), {"table": "products"})
        for bad in ('{"table": "products", "match": "Exact"}', '{"table": "products", "where": {"column": "x"}}',
                    '{"table": "products", "columns": [1]}', '{"table": "products", "extra": 1}', '{"table": "products"'):
            with self.assertRaises(ArgumentError, msg=bad):
                tool.parse_arguments(bad)
        with self.assertRaises(ArgumentError):
            self.toolkit.get("search").parse_arguments('{"query": "x", "limit": 11}')

    def test_search_ranks_and_normalises(self):
        hits = self.corpus.search("the lighthouse keeper")
        self.assertEqual([h["path"] for h in hits], ["town/lighthouse.md", "town/history.md"])
        self.assertEqual(hits[0]["score"], 2)
        self.assertEqual(hits[0]["snippet"], "The lighthouse keeper lit the lighthouse lamp.")
        self.assertEqual(self.corpus.search("the of"), [])
        found = self.corpus.search("ZOË marchetti", limit=1)
        self.assertEqual(found[0]["path"], "town/designer.md")
        self.assertEqual(found[0]["snippet"], "Designed by Zoë Marchetti.")

    def test_read_file_refuses_escapes(self):
        self.assertIn("1871", self.corpus.read_file("town/history.md"))
        for bad in ("../x.md", "/etc/passwd", "town\\history.md", "town/missing.md", ""):
            with self.assertRaises(ToolError, msg=bad):
                self.corpus.read_file(bad)

    def test_table_lookup(self):
        from roleplay.toolkit import ColumnFilter

        self.assertEqual(self.corpus.table_lookup("products", ColumnFilter("price", 64.5), columns=["name"]), [{"name": "Aster"}])
        self.assertEqual(self.corpus.table_lookup("products", ColumnFilter("name", "MINI"), match="contains")[0]["sku"], "B-2")
        self.assertEqual(self.corpus.table_lookup("products", ColumnFilter("name", "nothing")), [])
        with self.assertRaises(ToolError):
            self.corpus.table_lookup("missing")
        with self.assertRaises(ToolError):
            self.corpus.table_lookup("products", ColumnFilter("colour", "red"))

    def test_calculator(self):
        calc = self.corpus.calculator
        self.assertEqual(calc("450.0"), "450")
        self.assertEqual(calc("round(22 * 1.852, 1)"), "40.7")
        self.assertEqual(calc("sum(1, 2, 3) + max(4, 5) - abs(-1) + sqrt(16)"), "14")
        self.assertEqual(calc("12400000 / 86"), "144186.046512")
        for bad in ("1 / 0", "sqrt(-1)", "__import__('os')", "x + 1", "10 ** 10000", "1 +"):
            with self.assertRaises(ToolError, msg=bad):
                calc(bad)

    def test_executor_keeps_call_order_and_reports_errors(self):
        executor = ToolExecutor(self.toolkit)
        seen = []

        async def record(result, index):
            seen.append(index)

        executor.add_result_callback(record)
        calls = [ToolCallRequest("c0", "read_file", json.dumps({"path": "town/history.md"})),
                 ToolCallRequest("c1", "calculator", json.dumps({"expression": "1/0"})),
                 ToolCallRequest("c2", "nope", "{}")]
        results = asyncio.run(executor.run_calls(calls))
        self.assertEqual([r.call_id for r in results], ["c0", "c1", "c2"])
        self.assertEqual([r.ok for r in results], [True, False, False])
        self.assertEqual(seen, [0, 1, 2])
        self.assertTrue(results[1].content.startswith("Error: division by zero"))


if __name__ == "__main__":
    unittest.main()
