"""Unit conversions for the weather station's reports."""
