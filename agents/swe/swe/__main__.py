"""Command line: ``python3 -m swe --task TASK.json --workdir DIR --trace TRACE.jsonl --seed S``."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
from pathlib import Path

from .agent import Agent, dumps_result, result_record
from .config import load_config
from .environment import SWEEnvironment
from .hooks import FirstStepReporter, HookRegistry, ProgressReporter, TrajectoryRecorder
from .llm import LLMClient
from .tokens import TokenCounter, UsageTracker
from .tracing import Tracer

AGENT_NAME = "swe"


class TaskError(Exception):
    """The task file is missing a field or names files that do not exist."""


def load_task(path: Path) -> dict:
    try:
        task = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TaskError(f"{path}: cannot read the task: {exc}") from None
    for key in ("id", "issue", "test_command"):
        if not isinstance(task.get(key), str) or not task[key]:
            raise TaskError(f"{path}: field {key!r} must be a non-empty string")
    return task


def prepare_repository(task_path: Path, workdir: Path) -> Path:
    """The repository the agent edits: ``DIR/repo``, copied from the task's ``repo/`` if absent."""
    repo = workdir / "repo"
    if not repo.exists():
        source = task_path.parent / "repo"
        if not source.is_dir():
            raise TaskError(f"{task_path}: no repo/ directory beside the task file")
        shutil.copytree(source, repo, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return repo


def write_json_atomic(path: Path, record: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(dumps_result(record), encoding="utf-8")
    os.replace(tmp, path)


def _terminate(signum, frame):  # noqa: ARG001 - signal handler signature
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="swe", description=__doc__)
    parser.add_argument("--task", type=Path, required=True)
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--trace", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--config", type=Path, default=None, help="TOML file overriding the defaults")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)

    tracer = Tracer(args.trace, AGENT_NAME)
    Tracer.set_step(0)
    task_id = args.task.parent.name if args.task.name == "task.json" else args.task.stem
    root = tracer.start_span(
        "agent.run",
        "agent",
        {"pathfinder.framework": AGENT_NAME, "pathfinder.task_id": task_id, "pathfinder.seed": args.seed},
    )
    outcome, answer, exit_code = "crashed", "", 1
    try:
        config = load_config(args.config)
        task = load_task(args.task)
        task_id = task["id"]
        root.set_attribute("pathfinder.task_id", task_id)
        args.workdir.mkdir(parents=True, exist_ok=True)
        repo = prepare_repository(args.task, args.workdir)
        usage = UsageTracker(config.model.input_cost_per_1k, config.model.output_cost_per_1k)
        script_prefix = os.environ.get("PATHFINDER_SCRIPT") or f"{AGENT_NAME}/{task_id}"
        llm = LLMClient(config.model, tracer, TokenCounter(), usage, args.seed, script_prefix)
        env = SWEEnvironment(repo, task["test_command"], config)
        hooks = HookRegistry()
        hooks.add(TrajectoryRecorder(args.workdir / "trajectory.json"))
        hooks.add(FirstStepReporter(hooks, tracer))
        hooks.add(ProgressReporter(tracer, usage))
        agent = Agent(config, task, env, llm, tracer, hooks)
        with tracer.activate(root):
            result = agent.run()
        write_json_atomic(args.workdir / "result.json", result_record(task_id, result))
        outcome, answer, exit_code = result.status, result.submission, 0
        root.set_attribute("pathfinder.exit_reason", result.exit_reason)
        root.set_attribute("pathfinder.steps", result.steps)
        root.set_status("OK")
    except BaseException as exc:  # the trace must record every way a run can end
        root.record_exception(exc)
        print(f"swe: {type(exc).__name__}: {exc}", file=sys.stderr)
        if isinstance(exc, SystemExit) and isinstance(exc.code, int):
            exit_code = exc.code or 1
    finally:
        root.set_attribute("pathfinder.outcome", outcome)
        root.set_attribute("pathfinder.answer", answer)
        root.set_attribute("pathfinder.task_id", task_id)
        root.end()
        tracer.flush()
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
