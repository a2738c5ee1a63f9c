"""The findings store: what the researchers found, shared by all of them.

Researchers of one round run concurrently and add their findings when they finish; the store
serialises those writes under an asyncio lock, because `add` awaits (it announces the finding)
between reading and writing its state. Reads return findings in plan order (round, then
researcher index), never in arrival order, so what the writer and the reviewer see does not
depend on which researcher happened to finish first.

Researchers of a round are given findings of *earlier* rounds only (`retrieve(before_round=)`),
a snapshot that cannot change while they work.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass, field
from typing import Any

from research.events import EventBus
from research.summarize import focus_terms

CONFIDENCE_RANK = {"high": 3, "medium": 2, "low": 1, "none": 0}


@dataclass(frozen=True)
class Finding:
    researcher: int
    round: int
    question_id: str
    question: str
    answer: str
    evidence: str
    sources: tuple[str, ...] = ()
    confidence: str = "medium"
    status: str = "ok"            # ok | failed | timeout
    error: str = ""
    steps: int = 0

    @property
    def usable(self) -> bool:
        return self.status == "ok" and bool(self.answer.strip())

    @property
    def rank(self) -> int:
        return CONFIDENCE_RANK.get(self.confidence, 0)

    def sort_key(self) -> tuple[int, int]:
        return (self.round, self.researcher)

    def brief(self) -> str:
        """One line for prompts."""
        if not self.usable:
            reason = self.error or "no answer found"
            return f"[{self.question_id}] {self.question} -> NOT FOUND ({self.status}: {reason})"
        sources = ", ".join(self.sources) or "no source given"
        return (f"[{self.question_id}] {self.question} -> {self.answer} "
                f"(confidence {self.confidence}; sources: {sources}) Evidence: {self.evidence}")

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["sources"] = list(self.sources)
        return data


@dataclass
class FindingsStore:
    bus: EventBus
    capacity: int = 48
    _items: list[Finding] = field(default_factory=list)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    evicted: int = 0

    async def add(self, finding: Finding) -> None:
        async with self._lock:
            items = list(self._items)
            await self.bus.emit("finding.added", finding=finding)
            items.append(finding)
            if len(items) > self.capacity:
                # Evict the least useful: failed first, then lowest confidence, then oldest.
                victim = min(items, key=lambda f: (f.usable, f.rank, f.sort_key()))
                items.remove(victim)
                self.evicted += 1
            self._items = items

    def snapshot(self) -> list[Finding]:
        return sorted(self._items, key=Finding.sort_key)

    def for_round(self, round_no: int) -> list[Finding]:
        return [f for f in self.snapshot() if f.round == round_no]

    def retrieve(self, query: str, before_round: int, k: int = 4) -> list[Finding]:
        """Up to `k` usable findings of rounds before `before_round`, most relevant first."""
        wanted = focus_terms(query)
        scored = []
        for finding in self.snapshot():
            if finding.round >= before_round or not finding.usable:
                continue
            overlap = len(wanted & focus_terms(f"{finding.question} {finding.answer} "
                                               f"{finding.evidence}"))
            if overlap:
                scored.append((-overlap, finding.sort_key(), finding))
        scored.sort(key=lambda item: (item[0], item[1]))
        return [finding for _, _, finding in scored[:k]]
