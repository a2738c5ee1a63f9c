"""Event hooks: observers of the agent loop (progress output, streaming display, tests).

Callbacks are registered for a named event and live until unregistered; the agent removes
its own at the end of a run so that a reused client does not call into a finished run.
A failing callback is reported once on stderr and never breaks the loop.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Callable

EVENTS = ("step_start", "llm_delta", "llm_end", "tool_start", "tool_end", "run_end")


class Callbacks:
    def __init__(self) -> None:
        self._handlers: dict[str, list[Callable[..., Any]]] = {e: [] for e in EVENTS}
        self._lock = threading.Lock()
        self._failed: set[int] = set()

    def register(self, event: str, handler: Callable[..., Any]) -> Callable[[], None]:
        """Adds `handler` for `event`; returns a function that removes it again."""
        if event not in self._handlers:
            raise ValueError(f"unknown event {event!r}; known: {', '.join(EVENTS)}")
        with self._lock:
            self._handlers[event].append(handler)

        def unregister() -> None:
            with self._lock:
                if handler in self._handlers[event]:
                    self._handlers[event].remove(handler)
        return unregister

    def emit(self, event: str, **payload: Any) -> None:
        with self._lock:
            handlers = list(self._handlers.get(event, ()))
        for handler in handlers:
            try:
                handler(**payload)
            except Exception as exc:  # observers must not break the agent
                if id(handler) not in self._failed:
                    self._failed.add(id(handler))
                    print(f"toolcaller: callback for {event} failed: {exc!r}", file=sys.stderr)

    def count(self, event: str) -> int:
        with self._lock:
            return len(self._handlers.get(event, ()))
