import tempfile
import unittest
import unicodedata
from pathlib import Path

from research.tools.calculator import calculate
from research.tools.corpus import Corpus, ToolError


def make_corpus(root: Path) -> Corpus:
    (root / "town").mkdir()
    (root / "tables").mkdir()
    (root / "town" / "mill.md").write_text(
        "# Northgate Mill\n\nThe mill opened in 1851.\nThe mill closed in 1923.\n", "utf-8")
    (root / "town" / "people.md").write_text(
        unicodedata.normalize("NFD", "# People\n\nZoë Marchetti built the mill wheel.\n"), "utf-8")
    (root / "town" / "bad.md").write_bytes(b"# Bytes\n\nbroken \xff byte and mill\n")
    (root / "tables" / "prices.csv").write_text(
        "item,price\nsaffron bun,1.80\nharbour loaf,4.20\n", "utf-8")
    return Corpus(root)


class CorpusTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.corpus = make_corpus(Path(self.tmp.name))

    def tearDown(self):
        self.tmp.cleanup()

    def test_search_ranks_by_distinct_terms_then_occurrences(self):
        hits = self.corpus.search("When was the mill closed?")
        self.assertEqual([h.path for h in hits], ["town/mill.md", "town/bad.md", "town/people.md"])
        self.assertEqual((hits[0].score, hits[0].occurrences), (2, 4))
        self.assertEqual(hits[0].snippet, "The mill closed in 1923.")

    def test_search_ignores_stop_words_and_tables(self):
        self.assertEqual(self.corpus.search("what was the"), [])
        self.assertEqual(self.corpus.search("saffron"), [])

    def test_search_normalises_unicode(self):
        hits = self.corpus.search("Zoë")
        self.assertEqual([h.path for h in hits], ["town/people.md"])
        self.assertIn("Zoë", hits[0].snippet)  # NFC in the snippet

    def test_read_file_replaces_bad_bytes_and_refuses_escapes(self):
        self.assertIn("\ufffd", self.corpus.read_file("town/bad.md"))
        for bad in ["/etc/passwd", "../x.md", "town\\mill.md", "town/none.md", ""]:
            with self.assertRaises(ToolError):
                self.corpus.read_file(bad)

    def test_table_lookup_filters(self):
        self.assertEqual(self.corpus.table_lookup("prices", "price", 1.8),
                         [{"item": "saffron bun", "price": "1.80"}])
        self.assertEqual(self.corpus.table_lookup("prices", "item", "LOAF", "contains", ["price"]),
                         [{"price": "4.20"}])
        self.assertEqual(len(self.corpus.table_lookup("prices")), 2)
        with self.assertRaisesRegex(ToolError, "available tables: prices"):
            self.corpus.table_lookup("price")
        with self.assertRaisesRegex(ToolError, "columns: item, price"):
            self.corpus.table_lookup("prices", "cost", "1")
        with self.assertRaises(ToolError):
            self.corpus.table_lookup("prices", "item", "x", "Fuzzy")


class CalculatorTest(unittest.TestCase):
    def test_formats(self):
        self.assertEqual(calculate("184500 / 410"), "450")
        self.assertEqual(calculate("1.9 + 0.7 + 0.4 + 10.8 + 13.9"), "27.7")
        self.assertEqual(calculate("12400000 / 86"), "144186.046512")
        self.assertEqual(calculate("round(22 * 1.852, 1)"), "40.7")
        self.assertEqual(calculate("sum(1, 2, 3) + max(4, 5) - min(1, 2) + abs(-1) + sqrt(16)"), "15")
        self.assertEqual(calculate("-2 ** 2"), "-4")

    def test_refuses(self):
        for bad in ["1 / 0", "__import__('os')", "x + 1", "2 ** 100000", "sqrt(-1)", "1 +",
                    "'a' * 3", "(1).real"]:
            with self.assertRaises(ToolError, msg=bad):
                calculate(bad)


if __name__ == "__main__":
    unittest.main()
