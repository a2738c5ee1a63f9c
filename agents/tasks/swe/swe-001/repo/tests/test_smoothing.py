import unittest

from seriesutil.smoothing import cumulative_sum, moving_average


class MovingAverageTest(unittest.TestCase):
    def test_every_full_window(self):
        self.assertEqual(moving_average([1, 2, 3, 4], 2), [1.5, 2.5, 3.5])

    def test_window_equal_to_length(self):
        self.assertEqual(moving_average([2, 4, 6], 3), [4.0])

    def test_rejects_zero_window(self):
        with self.assertRaises(ValueError):
            moving_average([1], 0)


class CumulativeSumTest(unittest.TestCase):
    def test_running_total(self):
        self.assertEqual(cumulative_sum([1, 2, 3]), [1, 3, 6])


if __name__ == "__main__":
    unittest.main()
