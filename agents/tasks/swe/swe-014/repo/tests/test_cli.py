import io
import unittest
from pathlib import Path

from textcat.cli import main, to_utf8

DATA = Path(__file__).parent / "data"


class ToUtf8Test(unittest.TestCase):
    def test_utf8_is_unchanged(self):
        self.assertEqual(to_utf8("Zoë".encode("utf-8")), "Zoë".encode("utf-8"))

    def test_legacy_is_transcoded(self):
        raw = (DATA / "names-cp1252.txt").read_bytes()
        self.assertEqual(to_utf8(raw), "Müller\nGarçon\n".encode("utf-8"))


class MainTest(unittest.TestCase):
    def test_writes_every_file(self):
        out = io.BytesIO()
        self.assertEqual(main([str(DATA / "names-cp1252.txt")] * 2, out=out), 0)
        self.assertEqual(out.getvalue().decode("utf-8").count("Müller"), 2)

    def test_default_output_is_stdout(self):
        # Prints to the real stdout, which makes a failing run easy to eyeball.
        self.assertEqual(main([str(DATA / "names-cp1252.txt")]), 0)


if __name__ == "__main__":
    unittest.main()
