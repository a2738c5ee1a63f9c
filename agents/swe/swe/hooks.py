"""Agent hooks: callbacks the loop fires at fixed points of each step.

Hooks observe; they never change the loop's decisions. The trajectory recorder keeps a
replayable record of the run in the work directory, the first-step reporter emits one span
with what the model did first and then unregisters itself, the progress reporter emits one
span per step with the running usage so cost can be followed in the trace.
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
    """Hooks by name, in registration order. A name is registered once, so a hook wired twice
    (by the CLI and by a plugin) fires once. One-shot hooks remove themselves while an event is
    being dispatched, so dispatch goes over a snapshot of the registry."""

    def __init__(self) -> None:
        self._hooks: dict[str, AgentHook] = {}

    def add(self, hook: AgentHook, name: str | None = None) -> None:
        self._hooks.setdefault(name or type(hook).__name__, hook)

    def remove(self, hook: AgentHook) -> None:
        for name, registered in list(self._hooks.items()):
            if registered is hook:
                del self._hooks[name]

    def __len__(self) -> int:
        return len(self._hooks)

    def fire(self, event: str, *args: Any) -> None:
        for hook in list(self._hooks.values()):
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


class FirstStepReporter(AgentHook):
    """Emits one ``agent.first_step`` span (the first command) when the first step is done,
    then unregisters.

    A run's first action (reproduce, open the file, or edit blind) decides most of what
    follows, so a reader looking for where a run went wrong should not have to scan the whole
    trajectory for it. The hook is one-shot: it leaves the registry while the event that
    fired it is being dispatched, which the registry's snapshot makes safe.
    """

    def __init__(self, registry: HookRegistry, tracer: Tracer) -> None:
        self.registry = registry
        self.tracer = tracer
        self.action = ""

    def on_action(self, step: int, thought: str, action: str) -> None:
        if not self.action:
            self.action = action

    def on_step_done(self, step: int) -> None:
        words = self.action.split(maxsplit=1)
        command = words[0] if words else ""
        with self.tracer.span(
            "agent.first_step",
            "other",
            {
                "pathfinder.step": step,
                "pathfinder.first_command": command,
            },
        ):
            pass
        self.registry.remove(self)


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
