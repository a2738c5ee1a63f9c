"""Prompt templates and their renderer.

Templates use ``{{name}}`` placeholders. Rendering substitutes in a single pass, so braces
and placeholder-like text inside the values (code, JSON, issue text) are never interpreted.
"""

from __future__ import annotations

import re
from typing import Any

_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")


class TemplateError(KeyError):
    """A template names a variable that was not supplied."""


def render_template(template: str, **values: Any) -> str:
    missing = sorted({m.group(1) for m in _PLACEHOLDER.finditer(template)} - set(values))
    if missing:
        raise TemplateError(f"template variables not supplied: {', '.join(missing)}")
    return _PLACEHOLDER.sub(lambda m: str(values[m.group(1)]), template)


SYSTEM_TEMPLATE = """SETTING: You are an autonomous programmer, and you're working directly in the command line with a special interface.

The special interface consists of a file editor that shows you {{window}} lines of a file at a time.
You can use the following commands to navigate, search and edit files and to run the tests.

COMMANDS:
{{command_docs}}

Please note that THE EDIT COMMAND REQUIRES PROPER INDENTATION.
If you'd like to add the line '        print(x)' you must fully write that out, with all those spaces before the code! Indentation is important and code that is not indented correctly will fail and require fixing before it can be run.

RESPONSE FORMAT:
Your shell prompt is formatted as follows:
(Open file: <path>) (Current directory: <cwd>)
bash-$

You need to format your output using two fields; discussion and command.
Your output should always include _one_ discussion and _one_ command field EXACTLY as in the following example:
DISCUSSION
First I'll start by searching for the function the issue mentions, to see where it is defined.
```
search_dir parse_header
```

You should only include a *SINGLE* command in the command section and then wait for a response from the shell before continuing with more discussion and commands. Everything you include in the DISCUSSION section will be saved for future reference.
If you'd like to issue two commands at once, PLEASE DO NOT DO THAT! Please instead first submit just the first command, and then after receiving a response you'll be able to issue the second command.
You may also call the commands as functions when function calling is available; call exactly one per reply.
Only the commands listed above are available; there is no general shell."""

DEMONSTRATION = """Here is a demonstration of how to correctly accomplish a similar task.
--- DEMONSTRATION ---
ISSUE: `mean([])` raises ZeroDivisionError; it should return 0.0.
DISCUSSION
Let me find where mean is defined.
```
search_dir "def mean"
```
OBSERVATION: Found 1 matches for "def mean" in .: stats/core.py (1 matches)
DISCUSSION
I'll open the file at the definition.
```
open stats/core.py 1
```
OBSERVATION: 1:def mean(values):  2:    return sum(values) / len(values)
DISCUSSION
Return 0.0 for an empty list before dividing.
```
edit 2:2
    if not values:
        return 0.0
    return sum(values) / len(values)
end_of_edit
```
OBSERVATION: File updated.
DISCUSSION
Now I run the tests, and submit once they pass.
```
run_tests
```
--- END OF DEMONSTRATION ---"""

INSTANCE_TEMPLATE = """{{demonstration}}

We're currently solving the following issue within our repository. Here's the issue text:
ISSUE:
{{issue}}

INSTRUCTIONS:
Now, you're going to solve this issue on your own. Edit all the files you need to and run any checks or tests that you want. Remember, YOU CAN ONLY ENTER ONE COMMAND AT A TIME. You should always wait for feedback after every command.
When you're satisfied with all of the changes you've made, you can submit your changes to the code base by simply running the submit command.
The repository's tests run with: {{test_command}}
Files that are likely relevant: {{files}}

(Open file: {{open_file}}) (Current directory: /repo)
bash-$"""

NEXT_STEP_TEMPLATE = """{{observation}}
{{state}}
bash-$"""

NEXT_STEP_NO_OUTPUT_TEMPLATE = """Your command ran successfully and did not produce any output.
{{state}}
bash-$"""

FORMAT_ERROR_TEMPLATE = """Your output was not formatted correctly ({{error}}).
You must always include one discussion and one command as part of your response. Make sure you do not have multiple discussion/command tags.
Please make sure your output precisely matches the following format:
DISCUSSION
Discuss here with yourself about what you're planning and what you're going to do in this step.

```
command that you're going to run
```"""

TOOL_ERROR_TEMPLATE = """ERROR: {{error}}"""

STEPS_LEFT_TEMPLATE = """
(Only {{steps_left}} step(s) remain before the run stops and your current changes are submitted as they are.)"""

REVIEW_TEMPLATE = """Thank you for your work on this issue. Please carefully follow the steps below to help review your changes.

1. Re-run the tests and make sure they pass.
2. Remove any debugging code or files you created that are not part of the fix.
3. Make sure the change addresses the issue as described, including edge cases.

If you are satisfied, run submit again. Here is the diff of your changes:

<diff>
{{diff}}
</diff>"""

EMPTY_SUBMISSION_TEMPLATE = """You have not changed any file yet, so there is nothing to submit. Make the changes that fix the issue first. If you really believe no change is needed, run submit again."""


def build_system_prompt(command_docs: str, window: int) -> str:
    """The system message: setting, command reference and the response format."""
    return render_template(SYSTEM_TEMPLATE, window=window, command_docs=command_docs)


def build_instance_prompt(task: dict[str, Any], open_file: str = "n/a") -> str:
    """The first user message: one demonstration, the issue and the working instructions."""
    return render_template(
        INSTANCE_TEMPLATE,
        demonstration=DEMONSTRATION,
        issue=task["issue"],
        test_command=task["test_command"],
        files=", ".join(task.get("files") or []) or "(not given)",
        open_file=open_file,
    )


def build_format_error_prompt(error: str) -> str:
    """What the model is told after a reply that holds no usable action."""
    return render_template(FORMAT_ERROR_TEMPLATE, error=error)
