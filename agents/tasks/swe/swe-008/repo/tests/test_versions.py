import unittest

from relver.versions import is_newer, latest, parse_version


class VersionTest(unittest.TestCase):
    def test_numeric_comparison(self):
        self.assertTrue(is_newer("1.10.0", "1.9.0"))
        self.assertFalse(is_newer("1.2.0", "1.10.0"))

    def test_parse(self):
        self.assertEqual(parse_version("v2.0.1"), (2, 0, 1))

    def test_latest(self):
        self.assertEqual(latest(["0.9", "0.10", "0.2"]), "0.10")

    def test_invalid(self):
        with self.assertRaises(ValueError):
            parse_version("1.x")


if __name__ == "__main__":
    unittest.main()
