import unittest

from tinycsv import read_rows, split_row


class SplitRowTest(unittest.TestCase):
    def test_plain(self):
        self.assertEqual(split_row("a,b,c"), ["a", "b", "c"])

    def test_quoted_comma(self):
        self.assertEqual(split_row('a,"b,c",d'), ["a", "b,c", "d"])

    def test_empty_fields(self):
        self.assertEqual(split_row("a,,c"), ["a", "", "c"])

    def test_read_rows_skips_blank_lines(self):
        self.assertEqual(read_rows("x,y\n\n1,2\n"), [["x", "y"], ["1", "2"]])


if __name__ == "__main__":
    unittest.main()
