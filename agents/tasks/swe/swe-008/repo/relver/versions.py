"""Comparing dotted release versions."""


def parse_version(text):
    """The numeric components of a version such as '1.10.2'."""
    parts = text.strip().lstrip("v").split(".")
    if not all(p.isdigit() for p in parts):
        raise ValueError(f"invalid version: {text!r}")
    return parts


def is_newer(candidate, current):
    return parse_version(candidate) > parse_version(current)


def latest(versions):
    return max(versions, key=parse_version)
