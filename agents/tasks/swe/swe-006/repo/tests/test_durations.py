import unittest

from timefmt.durations import format_duration, parse_duration


class ParseDurationTest(unittest.TestCase):
    def test_single_unit(self):
        self.assertEqual(parse_duration("45s"), 45)

    def test_several_units(self):
        self.assertEqual(parse_duration("1h30m"), 5400)
        self.assertEqual(parse_duration("2m5s"), 125)

    def test_invalid(self):
        with self.assertRaises(ValueError):
            parse_duration("soon")

    def test_round_trip(self):
        self.assertEqual(parse_duration(format_duration(3725)), 3725)


if __name__ == "__main__":
    unittest.main()
