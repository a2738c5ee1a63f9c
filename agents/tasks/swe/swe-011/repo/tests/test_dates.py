import unittest

from calendarx.dates import day_of_year, days_in_month, is_leap_year


class LeapYearTest(unittest.TestCase):
    def test_rules(self):
        self.assertTrue(is_leap_year(2024))
        self.assertFalse(is_leap_year(2023))
        self.assertFalse(is_leap_year(1900))
        self.assertTrue(is_leap_year(2000))

    def test_february(self):
        self.assertEqual(days_in_month(1900, 2), 28)
        self.assertEqual(days_in_month(2000, 2), 29)

    def test_day_of_year(self):
        self.assertEqual(day_of_year(2023, 3, 1), 60)


if __name__ == "__main__":
    unittest.main()
