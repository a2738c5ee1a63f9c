import unittest

from pager import page_count, paginate


class PagesTest(unittest.TestCase):
    def test_exact(self):
        self.assertEqual(page_count(100, 10), 10)

    def test_partial_last_page(self):
        self.assertEqual(page_count(101, 10), 11)
        self.assertEqual(paginate(list(range(101)), 10, 11), [100])

    def test_empty(self):
        self.assertEqual(page_count(0, 10), 0)
        self.assertEqual(paginate([], 10, 1), [])


if __name__ == "__main__":
    unittest.main()
