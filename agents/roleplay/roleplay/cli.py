"""``python3 -m roleplay --task TASK.json --workdir DIR --trace TRACE.jsonl --seed S``."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tomllib
from dataclasses import fields
from pathlib import Path
from typing import Any

from .models import ChatConfig, ModelBackend
from .society import RolePlaying, SocietyConfig
from .tokens import TokenCounter
from .toolkit import CorpusToolkit, Toolkit
from .tracing import acting_as, recorder

AGENT_NAME = "roleplay"
FRAMEWORK = "roleplay"


class TaskFileError(ValueError):
    """The task file cannot be used."""


def read_task(path: Path) -> dict[str, Any]:
    try:
        task = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TaskFileError(f"{path}: {exc}") from None
    for key in ("id", "question"):
        if not isinstance(task.get(key), str) or not task[key].strip():
            raise TaskFileError(f"{path}: field {key!r} must be a non-empty string")
    return task


def _override(target: Any, table: dict[str, Any], where: str) -> None:
    names = {f.name: f for f in fields(target)}
    for key, value in table.items():
        if key not in names:
            raise TaskFileError(f"{where}: unknown setting {key!r}")
        setattr(target, key, value)


def load_settings(path: Path | None) -> tuple[ChatConfig, SocietyConfig]:
    chat, society = ChatConfig(), SocietyConfig()
    if path is not None:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
        _override(chat, data.get("model", {}), f"{path} [model]")
        _override(society, data.get("society", {}), f"{path} [society]")
    if os.environ.get("PATHFINDER_MODEL"):
        chat.model = os.environ["PATHFINDER_MODEL"]
    return chat, society


def write_result(workdir: Path, record: dict[str, Any]) -> None:
    workdir.mkdir(parents=True, exist_ok=True)
    tmp = workdir / "result.json.partial"
    tmp.write_text(json.dumps(record, ensure_ascii=False, indent=2), encoding="utf-8")
    os.replace(tmp, workdir / "result.json")


def _sigterm(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="roleplay", description="A role-playing society (AI user, AI assistant, critic) over a document corpus.")
    parser.add_argument("--task", type=Path, required=True)
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--trace", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--config", type=Path, help="TOML with [model] and [society] tables")
    parser.add_argument("--verbose", action="store_true", help="echo streamed text to stderr")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _sigterm)

    trace = recorder()
    trace.configure(args.trace)
    exit_code = 1
    with acting_as(AGENT_NAME, 0), trace.span("agent.run", "agent", {
        "pathfinder.framework": FRAMEWORK, "pathfinder.task_id": args.task.stem, "pathfinder.seed": args.seed,
    }, code=main.__code__) as root:
        root.set("pathfinder.outcome", "crashed")
        root.set("pathfinder.answer", "")
        try:
            task = read_task(args.task)
            root.set("pathfinder.task_id", task["id"])
            chat, society_config = load_settings(args.config)
            corpus = Path(os.environ.get("PATHFINDER_CORPUS") or Path(__file__).resolve().parents[2] / "tasks" / "corpus")
            if not corpus.is_dir():
                raise TaskFileError(f"PATHFINDER_CORPUS: {corpus} is not a directory")
            tools = CorpusToolkit(corpus)
            allowed = task.get("tools") or ["search", "read_file", "table_lookup", "calculator"]
            toolkit = Toolkit([getattr(tools, name) for name in ("search", "read_file", "table_lookup", "calculator") if name in allowed])
            model = ModelBackend(
                os.environ.get("PATHFINDER_LLM_URL", "http://127.0.0.1:8080"),
                chat,
                args.seed,
                os.environ.get("PATHFINDER_SCRIPT") or f"{AGENT_NAME}/{task['id']}",
                TokenCounter(),
                os.environ.get("PATHFINDER_API_KEY", ""),
            )
            if args.verbose:
                model.on_delta = lambda text: print(text, end="", file=sys.stderr, flush=True)
            society = RolePlaying(task["question"], model, toolkit, society_config)
            outcome = asyncio.run(society.run())
            write_result(args.workdir, {"task_id": task["id"], "status": outcome.status, "answer": outcome.answer, "steps": outcome.turns})
            (args.workdir / "board.json").write_text(json.dumps(outcome.transcript, ensure_ascii=False, indent=2), encoding="utf-8")
            root.update({
                "pathfinder.outcome": outcome.status,
                "pathfinder.answer": outcome.answer,
                "pathfinder.termination_reason": outcome.reason,
                "pathfinder.turns": outcome.turns,
                "pathfinder.usage.input_tokens": model.usage["prompt_tokens"],
                "pathfinder.usage.output_tokens": model.usage["completion_tokens"],
            })
            exit_code = 0
        except BaseException as exc:  # recorded on the root span, which then reads ERROR
            root.fail(exc)
            print(f"roleplay: {type(exc).__name__}: {exc}", file=sys.stderr)
            if isinstance(exc, SystemExit) and isinstance(exc.code, int) and exc.code:
                exit_code = exc.code
        finally:
            root.close()
    trace.flush()
    return exit_code
