import unittest

from dotpath import get_path


class GetPathTest(unittest.TestCase):
    def test_nested_dicts(self):
        self.assertEqual(get_path({"a": {"b": 1}}, "a.b"), 1)

    def test_list_index(self):
        self.assertEqual(get_path({"items": [{"id": 7}]}, "items.0.id"), 7)

    def test_missing_index_gives_default(self):
        self.assertEqual(get_path({"items": []}, "items.3", default="none"), "none")

    def test_missing_key(self):
        self.assertIsNone(get_path({}, "x.y"))


if __name__ == "__main__":
    unittest.main()
