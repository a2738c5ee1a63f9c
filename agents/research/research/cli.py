"""Command line: `python3 -m research --task T.json --workdir DIR --trace T.jsonl --seed S`.

Writes DIR/result.json and the trace, both also when the run crashes; exits 0 when the
research loop finished (whatever the answer), 1 when it crashed, 2 on bad input.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from research.agent import DeepResearchAgent, Outcome
from research.config import ConfigError, Settings
from research.events import EventBus
from research.tracing import Tracer

FRAMEWORK = "research"
log = logging.getLogger("research")


class TaskError(ValueError):
    """The task file is unreadable or malformed; the message names the file and field."""


def load_task(path: str) -> dict[str, Any]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise TaskError(f"{path}: cannot read task file: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise TaskError(f"{path}: not UTF-8 at byte {exc.start}") from None
    try:
        task = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TaskError(f"{path}: invalid JSON at line {exc.lineno} column {exc.colno}: "
                        f"{exc.msg}") from None
    if not isinstance(task, dict):
        raise TaskError(f"{path}: the task must be a JSON object")
    for key in ("id", "question"):
        if not isinstance(task.get(key), str) or not task[key].strip():
            raise TaskError(f"{path}: field {key!r} must be a non-empty string")
    return task


def write_result(workdir: Path, result: dict[str, Any]) -> None:
    workdir.mkdir(parents=True, exist_ok=True)
    target = workdir / "result.json"
    tmp = target.with_name("result.json.tmp")
    tmp.write_text(json.dumps(result, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, target)


def _progress_printer(event: str, **payload: Any) -> None:
    details = " ".join(f"{k}={v}" for k, v in payload.items() if k != "finding")
    print(f"[research] {event} {details}".rstrip(), file=sys.stderr)


def _on_sigterm(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m research",
                                     description="Deep-research agent over a local corpus.")
    parser.add_argument("--task", required=True, help="task JSON (agents/tasks/gaia/ID.json)")
    parser.add_argument("--workdir", required=True, help="directory for result.json")
    parser.add_argument("--trace", required=True, help="JSON Lines trace to write")
    parser.add_argument("--seed", type=int, default=0, help="seed sent with every request")
    parser.add_argument("--verbose", action="store_true", help="print progress to stderr")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    signal.signal(signal.SIGTERM, _on_sigterm)

    tracer = Tracer(args.trace, FRAMEWORK)
    workdir = Path(args.workdir)
    root = tracer.span("agent.run", "agent", {
        "gen_ai.operation.name": "invoke_agent",
        "pathfinder.framework": FRAMEWORK,
        "pathfinder.seed": args.seed,
    }, code=main)
    task_id = Path(args.task).stem
    outcome: Outcome | None = None
    exit_code = 1
    try:
        with root:
            task = load_task(args.task)
            task_id = task["id"]
            root.set({"pathfinder.task_id": task_id, "input.value": task["question"]})
            settings = Settings.from_env(args.seed, task_id)
            bus = EventBus()
            if args.verbose:
                bus.on("*", _progress_printer)
            agent = DeepResearchAgent(settings, tracer, bus)
            outcome = asyncio.run(agent.run(task["question"]))
            root.set({f"pathfinder.events.{k}": v for k, v in sorted(agent.stats.counts.items())})
            if agent.stats.first_finding_round is not None:
                root.set({"pathfinder.first_finding_round": agent.stats.first_finding_round})
            root.set({
                "pathfinder.outcome": outcome.status,
                "pathfinder.answer": outcome.answer,
                "pathfinder.stop_reason": outcome.stop_reason,
                "pathfinder.rounds": outcome.rounds,
                "pathfinder.steps": outcome.steps,
                "gen_ai.usage.input_tokens": agent.ledger.input_tokens,
                "gen_ai.usage.output_tokens": agent.ledger.output_tokens,
                "output.value": outcome.report,
            })
            if outcome.status != "completed":
                root.error(outcome.stop_reason, "NoAnswer")
            exit_code = 0
    except (TaskError, ConfigError) as exc:
        print(f"research: {exc}", file=sys.stderr)
        root.set({"pathfinder.outcome": "crashed", "pathfinder.answer": ""})
        exit_code = 2
    except BaseException as exc:  # noqa: BLE001 - recorded, then reported by exit status
        root.set({"pathfinder.outcome": "crashed", "pathfinder.answer": ""})
        if not isinstance(exc, (SystemExit, KeyboardInterrupt)):
            log.error("research crashed: %s: %s", type(exc).__name__, exc)
        exit_code = exc.code if isinstance(exc, SystemExit) and isinstance(exc.code, int) else 1
    finally:
        tracer.flush()
        if outcome is not None:
            result = {"task_id": task_id, "status": outcome.status, "answer": outcome.answer,
                      "steps": outcome.steps}
        else:
            result = {"task_id": task_id, "status": "failed", "answer": "", "steps": 0}
        try:
            write_result(workdir, result)
        except OSError as exc:
            print(f"research: cannot write {workdir / 'result.json'}: {exc}", file=sys.stderr)
            exit_code = exit_code or 1
    return exit_code
