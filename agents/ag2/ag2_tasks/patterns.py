"""Which AG2 pattern each task runs in (no AG2 import: the script tools read it too)."""

from __future__ import annotations

PATTERN_NAMES = ("tool_chat", "group_chat", "sequential")


def pattern_for(task_id: str) -> str:
    """The pattern a task runs in: the GAIA-like suite is dealt round the three patterns by
    the task's number, so each pattern meets every kind of question."""
    digits = "".join(ch for ch in task_id if ch.isdigit())
    number = int(digits) if digits else 0
    return PATTERN_NAMES[number % 3]
