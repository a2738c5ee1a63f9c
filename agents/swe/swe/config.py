"""Run configuration: model parameters, limits and interface settings.

Defaults suit the scripted Pathfinder backend (an 8,192-token window); every field can be
overridden from a TOML file passed with ``--config``.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any


@dataclass
class ModelConfig:
    base_url: str = "http://127.0.0.1:8080"
    model: str = "pathfinder-scripted"
    api_key: str = ""
    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 1024
    stream: bool = True
    tool_choice: str = "auto"
    stop: tuple[str, ...] = ()
    timeout_s: float = 60.0
    retries: int = 3
    retry_backoff_s: float = 0.5
    retry_backoff_max_s: float = 8.0
    context_window: int = 8192
    # Price per thousand tokens, used for the cost limit.
    input_cost_per_1k: float = 0.003
    output_cost_per_1k: float = 0.015


@dataclass
class AgentConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    # How the model's reply becomes an action: "auto" accepts both a fenced command block
    # and a function call, "thought_action" only the former, "function_calling" only the latter.
    parse_mode: str = "auto"
    step_limit: int = 30
    cost_limit: float = 2.0
    max_format_retries: int = 3
    # Observations older than the last N are collapsed to a single line.
    keep_last_observations: int = 5
    # Tokens kept free below the window for the completion and counting error.
    context_margin_tokens: int = 256
    window_lines: int = 50
    scroll_overlap: int = 2
    search_result_limit: int = 50
    test_timeout_s: float = 60.0
    max_observation_chars: int = 6000
    # Show the diff and a checklist on the first ``submit``; the second one submits.
    review_on_submit: bool = True


def _apply(target: Any, values: dict[str, Any], where: str) -> None:
    known = {f.name: f for f in fields(target)}
    for key, value in values.items():
        if key not in known:
            raise ValueError(f"{where}: unknown setting {key!r}")
        current = getattr(target, key)
        if isinstance(current, ModelConfig):
            if not isinstance(value, dict):
                raise ValueError(f"{where}.{key}: expected a table")
            _apply(current, value, f"{where}.{key}")
            continue
        if isinstance(current, tuple):
            value = tuple(value)
        elif isinstance(current, bool) != isinstance(value, bool) or (
            not isinstance(current, bool) and not isinstance(value, type(current))
            and not (isinstance(current, float) and isinstance(value, int))
        ):
            raise ValueError(f"{where}.{key}: expected {type(current).__name__}, got {value!r}")
        setattr(target, key, value)


def load_config(path: Path | None) -> AgentConfig:
    """Defaults, then the TOML file, then the ``PATHFINDER_*`` environment."""
    config = AgentConfig()
    if path is not None:
        with open(path, "rb") as fh:
            _apply(config, tomllib.load(fh), str(path))
    env = os.environ
    if env.get("PATHFINDER_LLM_URL"):
        config.model.base_url = env["PATHFINDER_LLM_URL"]
    if env.get("PATHFINDER_MODEL"):
        config.model.model = env["PATHFINDER_MODEL"]
    if env.get("PATHFINDER_API_KEY"):
        config.model.api_key = env["PATHFINDER_API_KEY"]
    return config
