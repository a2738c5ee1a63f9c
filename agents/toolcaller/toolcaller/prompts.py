"""Prompt templates: the system prompt, the task message and the nudges of the loop."""

from __future__ import annotations

import string
from typing import Any

SYSTEM_TEMPLATE = string.Template("""\
You are $agent_name, a careful research assistant that answers questions using tools.

Rules:
- Use the tools to find every fact you need; do not answer from memory.
- Call several tools at once when their results do not depend on each other.
- Cite nothing and explain nothing in the final reply.
- When you know the answer, reply with only a JSON object: {"answer": "..."}.
  Numbers are given without units or thousands separators unless the question asks otherwise.
- If the tools cannot answer the question, reply {"answer": "unknown"}.

Tools available: $tool_names.

$examples""")

EXAMPLES = """\
Example:
Question: What is the height of the Gannet Point lighthouse tower in metres?
(call search with {"query": "Gannet Point lighthouse height"}, then read_file on the best match)
Final reply: {"answer": "38"}"""

TASK_TEMPLATE = string.Template("""\
Question: $question

Answer with a JSON object {"answer": ...} once you are sure.""")

NUDGE_FORMAT = ('Your last reply did not contain a final answer. Reply with only a JSON object '
                'of the form {"answer": "..."}.')

NUDGE_TRUNCATED = ("Your last reply was cut off because it was too long. Reply again, shorter.")


def render(template: string.Template, **values: Any) -> str:
    """Fills a template; a missing variable is an error, not a silently kept `$name`."""
    return template.substitute(**{k: str(v) for k, v in values.items()})


def few_shot_examples(tool_names: list[str]) -> str:
    """The worked example, shown only when the tools it uses are offered."""
    if "search" in tool_names and "read_file" in tool_names:
        return EXAMPLES
    return ""


def system_prompt(agent_name: str, tool_names: list[str]) -> str:
    return render(SYSTEM_TEMPLATE, agent_name=agent_name,
                  tool_names=", ".join(tool_names) or "none",
                  examples=few_shot_examples(tool_names)).rstrip() + "\n"


def task_message(question: str) -> str:
    return render(TASK_TEMPLATE, question=question)
