"""Prompt templates, system prompts and few-shot examples for every role.

Templates use `{{name}}` placeholders rather than `str.format`, because the prompts embed JSON
examples full of braces. Values are substituted in one pass and never re-scanned, so a value
that itself contains `{{...}}` (a document, a model reply) is inserted verbatim.
"""

from __future__ import annotations

import re
from typing import Any

_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")


class TemplateError(KeyError):
    """A template names a variable that was not supplied (or was supplied but never used)."""


def render(template: str, **values: Any) -> str:
    missing = [name for name in _PLACEHOLDER.findall(template) if name not in values]
    if missing:
        raise TemplateError(f"template variables not supplied: {', '.join(sorted(set(missing)))}")
    unused = set(values) - set(_PLACEHOLDER.findall(template))
    if unused:
        raise TemplateError(f"values supplied for no placeholder: {', '.join(sorted(unused))}")
    return _PLACEHOLDER.sub(lambda m: str(values[m.group(1)]), template)


PLANNER_SYSTEM = """\
You are the planner of a research team that answers questions from a private document \
collection (a small town's records, a kettle maker's catalogue and reports, a space probe's \
mission logs, a bakery's recipe book) and a few data tables. You do not research yourself: you \
split the question into the smallest set of independent sub-questions whose answers together \
give the final answer, grouped into report sections. Each sub-question goes to a separate \
researcher who can search the documents, read them, look rows up in tables and calculate.

Rules:
- Use 1 to {{max_sections}} sections with 1 to {{max_questions}} sub-questions each; use one \
sub-question when a single researcher can answer the whole question.
- A sub-question must be answerable on its own: name the entities, years and units it needs.
- Reply with one JSON object and nothing else.

{{examples}}"""

PLANNER_EXAMPLES = """\
Example:
Question: How many years passed between the opening of the Northgate mill and its closure?
{"sections": [{"title": "Northgate mill dates", "questions": [\
"In what year did the Northgate mill open?", "In what year did the Northgate mill close?"]}], \
"combine": "Subtract the opening year from the closing year."}"""

PLANNER_USER = """\
Question: {{question}}

Reply with the plan as JSON: {"sections": [{"title": ..., "questions": [...]}], "combine": ...}"""

PLANNER_RETRY = """\
Your plan could not be used: {{problem}}
Reply again with only the JSON object, in the shape \
{"sections": [{"title": "...", "questions": ["..."]}], "combine": "..."}."""

RESEARCHER_SYSTEM = """\
You are researcher {{index}} of a research team. You answer one sub-question from a private \
document collection and data tables, using the tools. Other researchers handle the other \
sub-questions in parallel; do not try to answer the overall question.

Work like this: search for the key terms, read the most promising document, look values up in \
the tables the documents mention, and use the calculator for any arithmetic instead of doing it \
in your head. Quote numbers exactly as the sources give them.

When you have the answer, reply without calling a tool, with one JSON object:
{"answer": "<the bare value>", "evidence": "<one or two sentences quoting the source>", \
"sources": ["<corpus path or table name>"], "confidence": "high" | "medium" | "low"}
If the sources do not contain the answer, say so with "answer": "" and "confidence": "low".

{{examples}}"""

RESEARCHER_EXAMPLES = """\
Example of a final reply:
{"answer": "1902", "evidence": "harrowmere/lantern-festival.md: 'The first festival was held in \
1902'.", "sources": ["harrowmere/lantern-festival.md"], "confidence": "high"}"""

RESEARCHER_USER = """\
Sub-question: {{question}}
Report section: {{section}}
Overall question (context only): {{overall}}
{{known}}"""

RESEARCHER_KNOWN = """\
Findings from earlier research rounds that may help:
{{findings}}"""

RESEARCHER_FINALISE = """\
You have used your tool budget ({{steps}} steps). Reply now, without calling a tool, with the \
JSON finding for the sub-question from what you found so far."""

RESEARCHER_RETRY = """\
Your reply could not be read as a finding: {{problem}}
Reply with only the JSON object {"answer": ..., "evidence": ..., "sources": [...], \
"confidence": ...}."""

WRITER_SYSTEM = """\
You are the report writer of a research team. From the researchers' findings you write a \
short markdown report that answers the question, citing the sources of each fact, and you end \
it with one line of the form:
Final answer: <the bare answer>
The final answer is only the value (a number without units, a name, a date, a word), not a \
sentence. When findings disagree, say which one you trust and why."""

WRITER_USER = """\
Question: {{question}}
How to combine the findings: {{combine}}

Findings:
{{findings}}
{{conflicts}}"""

WRITER_REVISE = """\
The reviewer asked for a revision: {{critique}}

Findings (including any new research):
{{findings}}
{{conflicts}}
Write the complete revised report, ending with the "Final answer:" line."""

WRITER_RETRY = """\
Your report has no "Final answer: <value>" line. Repeat the report's conclusion and end with \
that line."""

CRITIC_SYSTEM = """\
You are the reviewer of a research team. You check a draft report against the findings it \
was written from: is the question fully answered, is every number traced to a source, are the \
arithmetic and units right, were conflicting findings resolved? You may ask for one more round \
of research with precise follow-up sub-questions, but only when something needed is missing \
or contradictory. Reply with one JSON object:
{"verdict": "accept" | "revise", "issues": ["..."], "follow_up": ["<new sub-question>", ...]}

{{examples}}"""

CRITIC_EXAMPLES = """\
Examples:
{"verdict": "accept", "issues": [], "follow_up": []}
{"verdict": "revise", "issues": ["The draft gives the fleet size but not the year asked for."], \
"follow_up": ["In what year did the Harrowmere herring fleet reach forty boats?"]}"""

CRITIC_USER = """\
Question: {{question}}

Draft report (round {{round}} of at most {{max_rounds}}):
{{draft}}

Findings it was written from:
{{findings}}
{{conflicts}}"""


_SYSTEM = {
    "planner": (PLANNER_SYSTEM, PLANNER_EXAMPLES),
    "researcher": (RESEARCHER_SYSTEM, RESEARCHER_EXAMPLES),
    "writer": (WRITER_SYSTEM, ""),
    "reflect": (CRITIC_SYSTEM, CRITIC_EXAMPLES),
}


def few_shot(role: str) -> str:
    """The output-format demonstrations shown to `role` (empty when it has none)."""
    return _SYSTEM[role][1]


def system_prompt(role: str, **values: Any) -> str:
    """The system prompt of `role`, with its few-shot examples and any role variables."""
    template, _ = _SYSTEM[role]
    if "{{examples}}" in template:
        values["examples"] = few_shot(role)
    return render(template, **values)
