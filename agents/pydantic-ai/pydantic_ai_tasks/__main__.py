"""Entry point: `python3 -m pydantic_ai_tasks --task T.json --workdir DIR --trace TRACE.jsonl --seed S`.

Runs one task on a Pydantic AI agent, writes DIR/result.json and the trace, exits 0 unless it
crashed (the agent contract, agents/CONTRACT.md).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path

from . import FRAMEWORK


def _terminate(signum, frame):  # SIGTERM as an exception, so the root span is closed
    raise SystemExit(128 + signum)


def write_result(workdir: str, result: dict) -> None:
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, "result.json")
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(result, f, ensure_ascii=False, indent=2)
    os.replace(path + ".tmp", path)


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _terminate)
    parser = argparse.ArgumentParser(prog="pydantic_ai_tasks",
                                     description="Run one task on Pydantic AI.")
    parser.add_argument("--task", required=True)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--trace", required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    from opentelemetry.trace import Status, StatusCode

    from pydantic_ai import Agent
    from pydantic_ai.models.instrumented import InstrumentationSettings

    from .agent import Endpoint, run_task
    from .tracing import provider

    tracer_provider, writer = provider(args.trace)
    # Pydantic AI's own instrumentation: agent runs, model requests and tool calls as GenAI spans.
    Agent.instrument_all(InstrumentationSettings(tracer_provider=tracer_provider))
    tracer = tracer_provider.get_tracer("pydantic_ai_tasks")
    task_id = "unknown"
    try:
        with tracer.start_as_current_span("agent.run", record_exception=True,
                                          set_status_on_exception=True) as root:
            root.set_attribute("gen_ai.agent.name", FRAMEWORK)
            root.set_attribute("pathfinder.framework", FRAMEWORK)
            root.set_attribute("pathfinder.seed", args.seed)
            root.set_attribute("pathfinder.outcome", "crashed")
            root.set_attribute("pathfinder.answer", "")
            task = json.loads(Path(args.task).read_text(encoding="utf-8"))
            task_id = str(task.get("id", "unknown"))
            root.set_attribute("pathfinder.task_id", task_id)
            root.set_attribute("input.value", task["question"])
            endpoint = Endpoint.from_env(args.seed)
            outcome = run_task(task["question"], list(task.get("tools") or []), endpoint)
            root.set_attribute("pathfinder.outcome", outcome.status)
            root.set_attribute("pathfinder.answer", outcome.answer)
            root.set_attribute("pathfinder.steps", outcome.steps)
            root.set_attribute("output.value", outcome.answer)
            if outcome.reason:
                root.set_attribute("pathfinder.reason", outcome.reason)
            root.set_status(Status(StatusCode.OK))
            write_result(args.workdir, {"task_id": task_id, "status": outcome.status,
                                        "answer": outcome.answer, "steps": outcome.steps})
        return 0
    except Exception as exc:
        print(f"pydantic_ai_tasks: crashed on {task_id}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        writer.shutdown()


if __name__ == "__main__":
    sys.exit(main())
