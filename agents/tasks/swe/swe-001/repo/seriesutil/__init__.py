"""Small helpers for numeric series."""
