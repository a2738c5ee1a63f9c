"""Runs the agent on one task and writes its trace.

    python -m qa_agent --task TASK.json --base-url URL --trace OUT.json [--script-key KEY]

Exit status 0 when the answer matches the task's, 1 when the run fails or answers wrongly;
the trace is written either way.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from opentelemetry.trace import Status, StatusCode
from pydantic_ai import Agent
from pydantic_ai.models.instrumented import InstrumentationSettings

from .agent import Settings, build_agent, instructions_for, usage_limits
from .answer import parse_answer, same_answer
from .tracing import provider


def main() -> int:
    parser = argparse.ArgumentParser(prog="qa_agent")
    parser.add_argument("--task", type=Path, required=True)
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--trace", type=Path, required=True)
    parser.add_argument("--script-key")
    args = parser.parse_args()
    task = json.loads(args.task.read_text(encoding="utf-8"))

    tracer_provider, exporter = provider("qa-agent")
    Agent.instrument_all(InstrumentationSettings(tracer_provider=tracer_provider))
    tracer = tracer_provider.get_tracer("qa_agent")
    solved = False
    with tracer.start_as_current_span("qa_agent.task") as root:
        root.set_attribute("task.id", task["id"])
        try:
            agent = build_agent(Settings(base_url=args.base_url, script_key=args.script_key))
            result = agent.run_sync(
                instructions_for(task["question"]), usage_limits=usage_limits()
            )
            answer = parse_answer(result.output)
            solved = same_answer(answer, str(task["answer"]))
            root.set_attribute("qa_agent.answer", answer)
        except Exception as err:  # the run's failure belongs in its trace
            root.record_exception(err)
            root.set_status(Status(StatusCode.ERROR, f"{type(err).__name__}: {err}"))
            print(f"qa_agent: {type(err).__name__}: {err}", file=sys.stderr)
    tracer_provider.shutdown()
    exporter.write(args.trace)
    print(json.dumps({"task": task["id"], "solved": solved}))
    return 0 if solved else 1


if __name__ == "__main__":
    sys.exit(main())
