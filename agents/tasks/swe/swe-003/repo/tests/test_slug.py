import unittest

from webtext.slug import slugify


class SlugifyTest(unittest.TestCase):
    def test_ascii(self):
        self.assertEqual(slugify("Hello, World!"), "hello-world")

    def test_accents_are_transliterated(self):
        self.assertEqual(slugify("Café Déjà Vu"), "cafe-deja-vu")

    def test_decomposed_input(self):
        self.assertEqual(slugify("Cafe\u0301"), "cafe")

    def test_separator(self):
        self.assertEqual(slugify("a b", separator="_"), "a_b")


if __name__ == "__main__":
    unittest.main()
