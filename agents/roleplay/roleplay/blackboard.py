"""The shared board: what the roles know in common.

Every agent posts notes here: the plan, instructions, facts found by tools, candidate final
answers and the critic's verdicts. Tools run concurrently, so posts go through a lock, and
notes carry a key assigned by the poster (turn, round, index) that fixes their order no
matter which coroutine finishes first. Posting emits ``note.posted`` on the event bus, which
is how roles wait for each other (:meth:`Blackboard.wait_for`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from .events import EventBus
from .textnorm import terms
from .tracing import current_span, traced

NoteKey = tuple[int, int, int]


@dataclass(frozen=True)
class Note:
    key: NoteKey
    kind: str  # plan | instruction | fact | answer | verdict
    author: str
    text: str
    source: str = ""
    data: Any = None


class Blackboard:
    def __init__(self, bus: EventBus, capacity_per_kind: int = 200) -> None:
        self.bus = bus
        self.capacity_per_kind = capacity_per_kind
        self._notes: dict[str, list[Note]] = {}
        self._lock = asyncio.Lock()
        self.evicted = 0

    @traced("blackboard.post", "other", attributes=lambda self, note: {"pathfinder.note.kind": note.kind, "pathfinder.note.source": note.source, "input.value": note.text})
    async def post(self, note: Note) -> None:
        async with self._lock:
            notes = list(self._notes.get(note.kind, []))
            # Validators and recorders may veto or annotate before the note lands.
            await self.bus.emit("note.posting", note)
            notes.append(note)
            notes.sort(key=lambda n: n.key)
            self._notes[note.kind] = self._evict(notes)
        await self.bus.emit("note.posted", note)

    def _evict(self, notes: list[Note]) -> list[Note]:
        """Keep the newest notes of a kind when it is over capacity, dropping the oldest."""
        overflow = len(notes) - self.capacity_per_kind
        if overflow <= 0:
            return notes
        self.evicted += overflow
        span = current_span()
        if span is not None:
            span.set("pathfinder.blackboard.evicted", overflow)
        return notes[overflow:]

    def notes(self, kind: str | None = None) -> list[Note]:
        if kind is not None:
            return list(self._notes.get(kind, []))
        merged = [n for notes in self._notes.values() for n in notes]
        return sorted(merged, key=lambda n: n.key)

    def latest(self, kind: str) -> Note | None:
        notes = self._notes.get(kind)
        return notes[-1] if notes else None

    @traced("memory.retrieve", "retriever", attributes=lambda self, query, k=3: {"input.value": query, "pathfinder.retrieval.k": k})
    def relevant(self, query: str, k: int = 3) -> list[Note]:
        """The ``k`` facts sharing the most words with ``query`` (newest first on ties)."""
        wanted = set(terms(query))
        scored = []
        for note in self._notes.get("fact", []):
            overlap = len(wanted & set(terms(note.text + " " + note.source)))
            if overlap:
                scored.append((-overlap, tuple(-part for part in note.key), note))
        scored.sort(key=lambda item: (item[0], item[1]))
        chosen = [note for _, _, note in scored[:k]]
        span = current_span()
        if span is not None:
            span.set("output.value", "\n".join(f"{n.source}: {n.text}" for n in chosen))
            span.set("pathfinder.retrieval.candidates", len(self._notes.get("fact", [])))
        return chosen

    def wait_for(self, kind: str, after: NoteKey | None = None) -> "asyncio.Future[Note]":
        """Resolves with the next note of ``kind`` posted with a key after ``after``."""
        return self.bus.wait_for(
            "note.posted", lambda note: note.kind == kind and (after is None or note.key > after)
        )

