"""Derives the Pydantic AI agent's scripts (scripts/pydantic-ai/) from the toolcaller's
(scripts/toolcaller/).

Both agents answer the same GAIA-like tasks with the same four corpus tools in one
conversation: a single assistant that calls the tools until it can give the final
`{"answer": ...}` reply. The Pydantic AI harness (agents/pydantic-ai/pydantic_ai_tasks) sends
its requests under the conversation key `main`, as the toolcaller does, so every step is the
toolcaller's: the tool calls, the reactions to what a tool said (`unless_observation_mentions`,
whose texts the harness's tools produce the same way), the provider faults (met by the OpenAI
SDK's own retries under Pydantic AI; a cut stream never happens, as the harness does not
stream) and the final answer. Only the `agent` field changes.

Run from the repository root: `python3 agents/tasks/derive_pydantic_ai_scripts.py`.
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "scripts" / "toolcaller"
TARGET = HERE / "scripts" / "pydantic-ai"
AGENT = "pydantic-ai"


def derive(script: dict) -> dict:
    return {"agent": AGENT, "task": script["task"], "conversations": {"main": script["conversations"]["main"]}}


def main() -> None:
    TARGET.mkdir(parents=True, exist_ok=True)
    for path in sorted(SOURCE.glob("*.json")):
        script = json.loads(path.read_text(encoding="utf-8"))
        out = TARGET / path.name
        out.write_text(json.dumps(derive(script), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {len(list(TARGET.glob('*.json')))} scripts to {TARGET}")


if __name__ == "__main__":
    main()
