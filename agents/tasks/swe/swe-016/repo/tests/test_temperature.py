import unittest

from unitconv.temperature import celsius_to_fahrenheit, fahrenheit_to_celsius, kelvin_to_celsius


class TemperatureTest(unittest.TestCase):
    def test_boiling_point_round_trip(self):
        self.assertAlmostEqual(fahrenheit_to_celsius(212), 100.0)
        self.assertAlmostEqual(celsius_to_fahrenheit(100), 212.0)

    def test_body_temperature(self):
        self.assertAlmostEqual(fahrenheit_to_celsius(98.6), 37.0)

    def test_kelvin(self):
        self.assertAlmostEqual(kelvin_to_celsius(273.15), 0.0)
        with self.assertRaises(ValueError):
            kelvin_to_celsius(-1)
