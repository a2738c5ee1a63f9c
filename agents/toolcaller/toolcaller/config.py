"""Run settings from the command line and the environment of the agent contract."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass


@dataclass
class RunSettings:
    task_path: str
    workdir: str
    trace_path: str
    seed: int
    llm_url: str
    model: str
    corpus_dir: str
    script: str | None
    api_key: str | None
    stream: bool = True
    max_steps: int = 10
    max_run_tokens: int = 60_000
    context_limit: int = 8192
    max_tokens: int = 1024
    temperature: float = 0.2


class ConfigError(Exception):
    pass


def parse_args(argv: list[str] | None = None) -> RunSettings:
    parser = argparse.ArgumentParser(prog="toolcaller",
                                     description="A function-calling agent over a document corpus.")
    parser.add_argument("--task", required=True, help="the task JSON file")
    parser.add_argument("--workdir", required=True, help="where result.json is written")
    parser.add_argument("--trace", required=True, help="the JSON Lines trace to write")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-steps", type=int, default=10)
    args = parser.parse_args(argv)
    env = os.environ
    url = env.get("PATHFINDER_LLM_URL", "")
    if not url:
        raise ConfigError("PATHFINDER_LLM_URL is not set (http://HOST:PORT or unix:/path)")
    corpus = env.get("PATHFINDER_CORPUS", "")
    if not corpus or not os.path.isdir(corpus):
        raise ConfigError(f"PATHFINDER_CORPUS={corpus!r} is not a directory")
    return RunSettings(
        task_path=args.task,
        workdir=args.workdir,
        trace_path=args.trace,
        seed=args.seed,
        llm_url=url,
        model=env.get("PATHFINDER_MODEL", "pathfinder-scripted"),
        corpus_dir=corpus,
        script=env.get("PATHFINDER_SCRIPT") or None,
        api_key=env.get("PATHFINDER_API_KEY") or env.get("OPENAI_API_KEY") or None,
        stream=env.get("PATHFINDER_STREAM", "1") != "0",
        max_steps=args.max_steps,
    )
