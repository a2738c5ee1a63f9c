"""Derives the AG2 agent's scripts (scripts/ag2/) from the toolcaller's (scripts/toolcaller/).

Both agents answer the same GAIA-like tasks with the same four corpus tools, so the tool
calls are the same; what differs is who says what. The AG2 harness runs each task in one of
three patterns (ag2_tasks.chats.pattern_for) and each role with a model has its own
conversation:

- tool_chat:  assistant  = the toolcaller's steps.
- group_chat: researcher = the tool steps, then the facts in words; writer = the final
              answer; manager = the name of the writer (the one speaker choice the group
              leaves to the model).
- sequential: researcher = the tool steps, the facts in words, then the summary AG2 asks
              for when the chat ends; writer = the final answer.

Run from the repository root: `python3 agents/tasks/derive_ag2_scripts.py`.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "scripts" / "toolcaller"
TARGET = HERE / "scripts" / "ag2"
sys.path.insert(0, str(HERE.parent / "ag2"))

from ag2_tasks.patterns import pattern_for  # noqa: E402


def answer_of(step: dict) -> str:
    content = step.get("content") or ""
    decoder = json.JSONDecoder()
    for i, ch in enumerate(content):
        if ch == "{":
            try:
                value = decoder.raw_decode(content, i)[0]["answer"]
            except (ValueError, KeyError, TypeError):
                continue
            return value if isinstance(value, str) else json.dumps(value)
    raise SystemExit(f"final step {content!r} holds no {{\"answer\": ...}} reply")


CORPUS = HERE / "corpus"


def worked_out(answer: str, steps: list[dict]) -> bool:
    """Whether a numeric answer appears in none of the documents the steps read: the model
    works it out (a count over documents) rather than copying it from a document or a
    calculator or table result. The facts and summary steps then
    list it in `computed`, as a model that worked it out can state it; the toolcaller meets
    the same answer at the end of its single conversation, where its context fitting happens
    to keep a copy of the number in view."""
    if not re.fullmatch(r"-?\d+(\.\d+)?", answer):
        return False
    calls = [c for step in steps for c in step.get("tool_calls") or []]
    if any(c.get("name") in ("calculator", "table_lookup") for c in calls):
        return False  # the number comes back in a tool result
    for step in steps:
        for call in step.get("tool_calls") or []:
            path = (call.get("arguments") or {}).get("path") if isinstance(call.get("arguments"), dict) else None
            if path and (CORPUS / path).is_file():
                text = (CORPUS / path).read_bytes().decode("utf-8", errors="replace")
                if re.search(rf"(?<![\d.]){re.escape(answer)}(?![\d])", text):
                    return False
    return True


def derive(script: dict) -> dict:
    steps = script["conversations"]["main"]
    tool_steps, final = steps[:-1], steps[-1]
    answer = answer_of(final)
    extra = {k: list(final[k]) for k in ("computed",) if k in final}
    if worked_out(answer, tool_steps):
        extra.setdefault("computed", [])
        if answer not in extra["computed"]:
            extra["computed"].append(answer)
    facts = {"content": f"I found what the question needs: the documents give {answer}.", **extra}
    summary = {"content": f"Summary: the tool results show {answer}.", **extra}
    writer = [dict(final)]
    pattern = pattern_for(script["task"])
    if pattern == "tool_chat":
        conversations = {"assistant": steps}
    elif pattern == "group_chat":
        conversations = {"researcher": tool_steps + [facts], "writer": writer,
                         "manager": [{"content": "writer"}]}
    else:
        conversations = {"researcher": tool_steps + [facts, summary], "writer": writer}
    return {"agent": "ag2", "task": script["task"], "conversations": conversations}


def main() -> None:
    TARGET.mkdir(parents=True, exist_ok=True)
    for path in sorted(SOURCE.glob("*.json")):
        script = json.loads(path.read_text(encoding="utf-8"))
        out = TARGET / path.name
        out.write_text(json.dumps(derive(script), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {len(list(TARGET.glob('*.json')))} scripts to {TARGET}")


if __name__ == "__main__":
    main()
