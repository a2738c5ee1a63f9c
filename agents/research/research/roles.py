"""The team's roles: who talks to the model, under which conversation key, with which settings.

Conversation keys name a conversation within a run for the X-Pathfinder-Script header (see
agents/CONTRACT.md): `planner`, `researcher-N` (N counts sub-questions across rounds in plan
order, so the same plan always gives the same keys), `writer` and `reflect`.
"""

from __future__ import annotations

from dataclasses import dataclass

@dataclass(frozen=True)
class Role:
    name: str
    temperature: float
    max_tokens: int
    uses_tools: bool = False

    def conversation(self, index: int | None = None) -> str:
        return self.name if index is None else f"{self.name}-{index}"


PLANNER = Role("planner", temperature=0.2, max_tokens=600)
RESEARCHER = Role("researcher", temperature=0.0, max_tokens=700, uses_tools=True)
WRITER = Role("writer", temperature=0.3, max_tokens=900)
CRITIC = Role("reflect", temperature=0.0, max_tokens=500)

ALL_ROLES = (PLANNER, RESEARCHER, WRITER, CRITIC)


def researcher_key(index: int) -> str:
    """The conversation key of the researcher working on the `index`-th sub-question."""
    if index < 0:
        raise ValueError(f"researcher index must be non-negative, got {index}")
    return RESEARCHER.conversation(index)
