"""Entry point: run one task, write DIR/result.json and the trace; exit 0 unless crashed."""

from __future__ import annotations

import json
import os
import signal
import sys

from .agent import load_task, make_agent
from .config import ConfigError, parse_args
from .tools import default_registry
from .tracing import Tracer


def _terminate(signum, frame):  # turn SIGTERM into an exception so the trace is closed
    raise SystemExit(128 + signum)


def write_result(workdir: str, result: dict) -> None:
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, "result.json")
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(result, f, ensure_ascii=False, indent=2)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _terminate)
    try:
        settings = parse_args(argv)
    except ConfigError as exc:
        print(f"toolcaller: {exc}", file=sys.stderr)
        return 2
    tracer = Tracer(settings.trace_path)
    task_id = "unknown"
    try:
        with tracer.span("agent.run", kind="agent", code=main, attributes={
                "pathfinder.framework": "toolcaller", "pathfinder.seed": settings.seed,
                "pathfinder.task_id": task_id, "pathfinder.outcome": "crashed",
                "pathfinder.answer": ""}) as root:
            task = load_task(settings.task_path)
            task_id = str(task.get("id", "unknown"))
            root.set("pathfinder.task_id", task_id)
            root.set("input.value", task["question"])
            registry = default_registry()
            offered = task.get("tools") or registry.names()
            agent = make_agent(settings, tracer, registry.subset(offered))
            result = agent.run(task["question"])
            root.set("pathfinder.outcome", result.status)
            root.set("pathfinder.answer", result.answer)
            root.set("pathfinder.steps", result.steps)
            root.set("output.value", result.answer)
            if result.reason:
                root.set("pathfinder.reason", result.reason)
            root.set("gen_ai.usage.input_tokens", agent.usage.input_tokens)
            root.set("gen_ai.usage.output_tokens", agent.usage.output_tokens)
            write_result(settings.workdir, {"task_id": task_id, "status": result.status,
                                            "answer": result.answer, "steps": result.steps})
        return 0
    except Exception as exc:
        print(f"toolcaller: crashed on {task_id}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        tracer.close()


if __name__ == "__main__":
    sys.exit(main())
