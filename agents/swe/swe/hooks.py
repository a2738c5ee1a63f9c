"""Agent hooks: callbacks the loop fires at fixed points of each step.

Hooks observe; they never change the loop's decisions. The trajectory recorder keeps a
replayable record of the run in the work directory, the progress reporter emits one span
per step with the running usage so cost can be followed in the trace.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .tokens import UsageTracker
from .tracing import Tracer


class AgentHook:
    def on_run_start(self, task_id: str) -> None: ...
    def on_step_start(self, step: int) -> None: ...
    def on_action(self, step: int, thought: str, action: str) -> None: ...
    def on_observation(self, step: int, observation: str) -> None: ...
    def on_step_done(self, step: int) -> None: ...
    def on_run_done(self, status: str, submission: str) -> None: ...


class HookRegistry:
    """Ordered hook list; hooks registered at construction stay registered for the run."""

    def __init__(self) -> None:
        self._hooks: list[AgentHook] = []

    def add(self, hook: AgentHook) -> None:
        if hook not in self._hooks:
            self._hooks.append(hook)

    def remove(self, hook: AgentHook) -> None:
        self._hooks.remove(hook)

    def __len__(self) -> int:
        return len(self._hooks)

    def fire(self, event: str, *args: Any) -> None:
        for hook in list(self._hooks):
            getattr(hook, event)(*args)


class TrajectoryRecorder(AgentHook):
    """Writes ``trajectory.json`` (thought, action, observation per step) into the work dir."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.steps: list[dict[str, Any]] = []
        self.task_id = ""

    def on_run_start(self, task_id: str) -> None:
        self.task_id = task_id

    def on_action(self, step: int, thought: str, action: str) -> None:
        self.steps.append({"step": step, "thought": thought, "action": action, "observation": ""})

    def on_observation(self, step: int, observation: str) -> None:
        if self.steps and self.steps[-1]["step"] == step:
            self.steps[-1]["observation"] = observation

    def on_run_done(self, status: str, submission: str) -> None:
        record = {"task_id": self.task_id, "status": status, "submission": submission, "trajectory": self.steps}
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(record, indent=2, ensure_ascii=False), encoding="utf-8")
        os.replace(tmp, self.path)


class ProgressReporter(AgentHook):
    """Emits an ``agent.progress`` span after every step with the run's cumulative usage."""

    def __init__(self, tracer: Tracer, usage: UsageTracker) -> None:
        self.tracer = tracer
        self.usage = usage

    def on_step_done(self, step: int) -> None:
        with self.tracer.span(
            "agent.progress",
            "other",
            {
                "pathfinder.usage.input_tokens": self.usage.input_tokens,
                "pathfinder.usage.output_tokens": self.usage.output_tokens,
                "pathfinder.usage.cost": round(self.usage.cost, 6),
                "pathfinder.usage.calls": self.usage.calls,
            },
        ):
            pass
