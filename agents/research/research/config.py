"""Run settings: where the model and corpus are, and every limit the agent enforces.

Limits live here, not scattered through the code, so a trace's behaviour can be read against
one table of numbers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field


class ConfigError(ValueError):
    """A setting is missing or malformed; the message names it."""


@dataclass(frozen=True)
class Limits:
    context_window: int = 8192          # the API's window, in its approximate tokens
    max_sections: int = 3               # planner: sections per plan
    max_questions: int = 3              # planner: sub-questions per section
    max_rounds: int = 3                 # research rounds, including follow-ups from review
    max_parallel: int = 3               # researchers running at the same time
    researcher_steps: int = 8           # model calls per researcher before it must answer
    repeat_limit: int = 2               # identical tool calls tolerated before forcing an answer
    researcher_timeout_s: float = 120.0
    request_timeout_s: float = 60.0
    retries: int = 3                    # extra attempts per model call on retryable errors
    backoff_s: float = 0.25
    tool_output_tokens: int = 280       # longer tool outputs are summarised
    findings_tokens: int = 1800         # budget for findings in writer and critic prompts
    memory_capacity: int = 48           # findings kept in the shared store
    run_token_budget: int = 200_000     # total tokens (in + out) for the whole run


@dataclass(frozen=True)
class Settings:
    llm_url: str
    model: str
    corpus: str
    script_prefix: str
    seed: int
    limits: Limits = field(default_factory=Limits)

    @staticmethod
    def from_env(seed: int, task_id: str, env: dict[str, str] | None = None) -> "Settings":
        env = dict(os.environ if env is None else env)
        url = env.get("PATHFINDER_LLM_URL", "").strip()
        if not url:
            raise ConfigError("PATHFINDER_LLM_URL is not set (http://HOST:PORT or unix:/path)")
        corpus = env.get("PATHFINDER_CORPUS", "").strip()
        if not corpus:
            raise ConfigError("PATHFINDER_CORPUS is not set (the agents/tasks/corpus directory)")
        if not os.path.isdir(corpus):
            raise ConfigError(f"PATHFINDER_CORPUS={corpus!r} is not a directory")
        prefix = env.get("PATHFINDER_SCRIPT", "").strip() or f"research/{task_id}"
        return Settings(
            llm_url=url,
            model=env.get("PATHFINDER_MODEL", "").strip() or "pathfinder-scripted",
            corpus=corpus,
            script_prefix=prefix.rstrip("/"),
            seed=seed,
        )
