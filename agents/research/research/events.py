"""Progress events and the hooks that listen to them.

Components announce what they did (`plan.ready`, `round.started`, `tool.finished`,
`finding.added`, `llm.completed`, `review.done`, ...) and anything interested subscribes:
the CLI's progress printer, the run statistics, one-shot waiters. Handlers may be plain or
async functions; a failing handler is logged and never breaks the research.
"""

from __future__ import annotations

import inspect
import logging
import threading
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

log = logging.getLogger("research.events")

Handler = Callable[..., Any | Awaitable[Any]]


@dataclass(frozen=True)
class Subscription:
    event: str
    handler: Handler
    once: bool
    order: int


class EventBus:
    def __init__(self) -> None:
        self._handlers: dict[str, list[Subscription]] = {}
        self._lock = threading.Lock()
        self._order = 0
        self.errors = 0

    def on(self, event: str, handler: Handler, once: bool = False) -> Subscription:
        """Subscribes `handler` to `event` (`*` for every event)."""
        with self._lock:
            self._order += 1
            sub = Subscription(event, handler, once, self._order)
            self._handlers.setdefault(event, []).append(sub)
            return sub

    def off(self, sub: Subscription) -> None:
        with self._lock:
            subs = self._handlers.get(sub.event, [])
            if sub in subs:
                subs.remove(sub)

    def subscribers(self, event: str) -> int:
        with self._lock:
            return len(self._handlers.get(event, [])) + len(self._handlers.get("*", []))

    async def emit(self, event: str, **payload: Any) -> None:
        # Handlers may subscribe or unsubscribe while we deliver (one-shot handlers remove
        # themselves), so deliver to a snapshot taken under the lock.
        with self._lock:
            targets = sorted(
                self._handlers.get(event, []) + self._handlers.get("*", []),
                key=lambda s: s.order,
            )
        for sub in targets:
            if sub.once:
                self.off(sub)
            try:
                outcome = sub.handler(event, **payload)
                if inspect.isawaitable(outcome):
                    await outcome
            except Exception:  # a hook must never break the research
                self.errors += 1
                log.exception("event handler for %r failed", event)


class RunStatistics:
    """Counts events per kind and notes the round of the run's first finding; the agent copies
    both onto the root span."""

    def __init__(self, bus: EventBus) -> None:
        self.counts: dict[str, int] = {}
        self.first_finding_round: int | None = None
        self._bus = bus
        self._lock = threading.Lock()
        bus.on("*", self._count)
        bus.on("plan.ready", self._await_first_finding)

    def _count(self, event: str, **_: Any) -> None:
        with self._lock:
            self.counts[event] = self.counts.get(event, 0) + 1

    def _await_first_finding(self, event: str, **_: Any) -> None:
        # A one-shot waiter, armed once there is a plan to research: how soon the research
        # produced anything. It subscribes while `plan.ready` is being delivered.
        self._bus.on("finding.added", self._first_finding, once=True)

    def _first_finding(self, event: str, finding: Any, **_: Any) -> None:
        self.first_finding_round = finding.round
