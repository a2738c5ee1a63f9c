"""Role prompts: templates with placeholders filled in several passes.

Role names are known when the society is set up, the (specified) task and plan only after
the task specifier has answered, so a :class:`TextPrompt` can be filled partially: named
placeholders are substituted, the others stay, and the result can be formatted again.
:meth:`TextPrompt.render` produces the final text once every placeholder is filled.
"""

from __future__ import annotations

import string
from typing import Any

_FORMATTER = string.Formatter()


class PromptError(KeyError):
    """A prompt was rendered while placeholders were still unfilled."""


def escape_braces(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


class TextPrompt(str):
    @property
    def key_words(self) -> set[str]:
        return {field for _, field, _, _ in _FORMATTER.parse(self) if field}

    def format(self, *args: Any, **kwargs: Any) -> "TextPrompt":  # type: ignore[override]
        """Fill the given placeholders, keep the others; the result can be formatted again."""
        if args:
            raise TypeError("TextPrompt.format takes keyword arguments only")
        parts: list[str] = []
        for literal, field, spec, conversion in _FORMATTER.parse(self):
            parts.append(escape_braces(literal))
            if field is None:
                continue
            if field in kwargs:
                value = _FORMATTER.convert_field(kwargs[field], conversion) if conversion else kwargs[field]
                # The value is now template text: its own braces must not become placeholders.
                parts.append(escape_braces(_FORMATTER.format_field(value, spec or "")))
            else:
                suffix = (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "")
                parts.append("{" + field + suffix + "}")
        return TextPrompt("".join(parts))

    def render(self) -> str:
        """The final text; every placeholder must have been filled."""
        missing = self.key_words
        if missing:
            raise PromptError(f"prompt placeholders left unfilled: {', '.join(sorted(missing))}")
        return str.format(self)


TASK_SPECIFIER_SYSTEM = TextPrompt("You are a {specifier_role}. You make a task more specific and plan how to solve it.")

TASK_SPECIFY_PROMPT = TextPrompt(
    """Here is a task that {assistant_role} will help {user_role} to complete: {task}
The {assistant_role} can use these tools: {tool_names}.
Make the task more specific: say which facts must be found and how they combine into the answer.
Reply with one JSON object and nothing else, in this form:
{{"specified_task": "<the task, made specific>", "subgoals": ["<step>", "..."], "answer_format": "<what the final answer looks like>"}}"""
)

ASSISTANT_PROMPT = TextPrompt(
    """===== RULES OF ASSISTANT =====
Never forget you are a {assistant_role} and I am a {user_role}. Never flip roles! Never instruct me!
We share a common interest in collaborating to successfully complete a task.
You must help me to complete the task.
Here is the task: {task}. Never forget our task!
The plan we agreed on (JSON): {plan}
I must instruct you based on your expertise and my needs to complete the task.
You have tools over a document corpus. Use them to find facts and to compute; never state a fact you have not read in a tool result, and never do arithmetic in your head.
I must give you one instruction at a time.
You must write a specific solution that appropriately solves the requested instruction and explain your solutions.
Unless I say the task is completed, you should always start with:

Solution: <YOUR_SOLUTION>

<YOUR_SOLUTION> should be very specific: include the facts you found and the file or table they come from.
Always end <YOUR_SOLUTION> with: Next request.
When I ask for the final answer, reply with only one JSON object, with the bare value and no sentence:
{{"final_answer": "<value>", "evidence": "<the facts and sources it rests on>"}}"""
)

USER_PROMPT = TextPrompt(
    """===== RULES OF USER =====
Never forget you are a {user_role} and I am a {assistant_role}. Never flip roles! You will always instruct me.
We share a common interest in collaborating to successfully complete a task.
I must help you to complete the task.
Here is the task: {task}. Never forget our task!
The plan we agreed on (JSON): {plan}
You must instruct me based on my expertise and your needs to solve the task ONLY in the following two ways:

1. Instruct with a necessary input:
Instruction: <YOUR_INSTRUCTION>
Input: <YOUR_INPUT>

2. Instruct without any input:
Instruction: <YOUR_INSTRUCTION>
Input: None

The "Instruction" describes a task or question. The paired "Input" provides further context or information for the requested "Instruction".
You must give me one instruction at a time.
I must write a response that appropriately solves the requested instruction.
Keep giving me instructions until the facts are found, then instruct me to give the final answer.
A {critic_role} checks every final answer; you will see the verdict. When the answer is accepted, you must only reply with a single word {done_token}.
Never say {done_token} unless my responses have solved your task."""
)

CRITIC_PROMPT = TextPrompt(
    """You are a {critic_role}. {assistant_role} and {user_role} are solving a task together: {task}
The answer must be: {answer_format}
You check a proposed final answer against the evidence the {assistant_role} gathered with tools and recorded on the shared board.
Accept the answer when the evidence supports it and it has the required form; otherwise ask for a revision and say exactly what is wrong.
Reply with only one JSON object: {{"verdict": "accept" or "revise", "reason": "<one sentence>"}}"""
)

CRITIC_REVIEW_PROMPT = TextPrompt(
    """Proposed final answer: {answer}
Evidence given: {evidence}
Facts on the shared board:
{facts}"""
)

USER_FIRST_INPUT = TextPrompt(
    """Now start to give me instructions one by one. Only reply with Instruction and Input."""
)

VERDICT_NOTE = TextPrompt(
    """[{critic_role}] verdict on the final answer {answer}: {verdict}. {reason}"""
)

BOARD_FACTS_NOTE = TextPrompt(
    """[shared board] facts relevant to your next instruction:
{facts}"""
)


class PromptTemplateGenerator:
    """System prompt templates by role type."""

    def __init__(self) -> None:
        self.templates = {
            "assistant": ASSISTANT_PROMPT,
            "user": USER_PROMPT,
            "critic": CRITIC_PROMPT,
            "task_specifier": TASK_SPECIFIER_SYSTEM,
        }

    def get_system_prompt(self, role_type: str) -> TextPrompt:
        try:
            return self.templates[role_type]
        except KeyError:
            raise PromptError(f"no system prompt template for role type {role_type!r}") from None
