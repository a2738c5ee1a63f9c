import unittest

from sizes.human import format_size, parse_size


class FormatSizeTest(unittest.TestCase):
    def test_small(self):
        self.assertEqual(format_size(512), "512.0 B")

    def test_boundaries(self):
        self.assertEqual(format_size(1024), "1.0 KiB")
        self.assertEqual(format_size(1048576), "1.0 MiB")

    def test_parse(self):
        self.assertEqual(parse_size("2.0 KiB"), 2048)


if __name__ == "__main__":
    unittest.main()
