import unittest

from wordstats.counts import most_common, word_counts


class WordCountsTest(unittest.TestCase):
    def test_case_insensitive(self):
        self.assertEqual(word_counts("The cat saw the CAT"), {"the": 2, "cat": 2, "saw": 1})

    def test_sharp_s(self):
        self.assertEqual(word_counts("STRASSE straße"), {"strasse": 2})

    def test_most_common(self):
        self.assertEqual(most_common("a b a c a b", 2), [("a", 3), ("b", 2)])


if __name__ == "__main__":
    unittest.main()
