"""Human-friendly durations such as 1h30m or 45s."""

import re

UNIT_SECONDS = {"h": 3600, "m": 60, "s": 1}
_PART = re.compile(r"(\d+)([hms])")


def parse_duration(text):
    """Total seconds in a duration string made of <number><unit> parts."""
    text = text.strip().lower()
    if not text:
        raise ValueError("empty duration")
    match = _PART.search(text)
    if match is None:
        raise ValueError(f"invalid duration: {text!r}")
    amount, unit = match.groups()
    return int(amount) * UNIT_SECONDS[unit]


def format_duration(seconds):
    hours, rest = divmod(int(seconds), 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{hours}h" if hours else "", f"{minutes}m" if minutes else "", f"{secs}s" if secs else ""]
    return "".join(parts) or "0s"
