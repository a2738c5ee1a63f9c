"""A small asyncio event bus: named events, sync or async handlers, one-shot subscriptions.

Handlers run in subscription order. A one-shot handler is removed the moment it fires,
which is how :meth:`EventBus.wait_for` turns an event into an awaitable.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

Handler = Callable[[Any], "Awaitable[None] | None"]


@dataclass
class Subscription:
    token: int
    event: str
    handler: Handler
    once: bool


class EventBus:
    def __init__(self) -> None:
        self._subscriptions: dict[str, dict[int, Subscription]] = {}
        self._tokens = itertools.count(1)

    def subscribe(self, event: str, handler: Handler, once: bool = False) -> int:
        token = next(self._tokens)
        self._subscriptions.setdefault(event, {})[token] = Subscription(token, event, handler, once)
        return token

    def unsubscribe(self, token: int) -> None:
        for handlers in self._subscriptions.values():
            handlers.pop(token, None)

    def handler_count(self, event: str) -> int:
        return len(self._subscriptions.get(event, {}))

    async def emit(self, event: str, payload: Any) -> None:
        handlers = self._subscriptions.get(event, {})
        # Iterate over a copy: one-shot handlers leave, and handlers may (un)subscribe.
        for token, subscription in list(handlers.items()):
            if subscription.once:
                handlers.pop(token, None)
            result = subscription.handler(payload)
            if inspect.isawaitable(result):
                await result

    def wait_for(self, event: str, predicate: Callable[[Any], bool] = lambda _: True) -> "asyncio.Future[Any]":
        """A future resolved with the first payload of ``event`` that satisfies ``predicate``."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()

        def resolve(payload: Any) -> None:
            if future.done():
                return
            if predicate(payload):
                future.set_result(payload)
            else:  # not the one we wait for: listen again
                self.subscribe(event, resolve, once=True)

        self.subscribe(event, resolve, once=True)
        return future
