"""Keeping a conversation inside the model's context window.

Before every model call the prompt is measured with the API's own token rule. When it would
not fit the window together with the completion budget, the oldest tool exchanges are
dropped (an assistant message with its tool results, never half of one) and replaced by a note;
the system prompt and the task message always stay. If dropping is not enough, the longest
remaining tool results are clipped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from research import tokens
from research.textnorm import clip

SAFETY_MARGIN = 64


class ContextOverflow(RuntimeError):
    """The conversation cannot be made to fit even after trimming."""


@dataclass(frozen=True)
class FitReport:
    tokens_before: int
    tokens_after: int
    dropped_messages: int
    clipped_messages: int

    @property
    def changed(self) -> bool:
        return self.dropped_messages > 0 or self.clipped_messages > 0


def budget_for(window: int, max_tokens: int, tools: list[dict[str, Any]] | None) -> int:
    """Prompt tokens available for messages once tools and the completion are paid for."""
    return window - max_tokens - tokens.count_tools(tools) - SAFETY_MARGIN


def _groups(messages: list[dict[str, Any]], start: int) -> list[list[int]]:
    """Indices from `start` grouped so an assistant message travels with its tool results."""
    groups: list[list[int]] = []
    for i in range(start, len(messages)):
        if messages[i].get("role") == "tool" and groups:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def fit_messages(
    messages: list[dict[str, Any]], window: int, max_tokens: int,
    tools: list[dict[str, Any]] | None = None, keep_head: int = 2,
) -> tuple[list[dict[str, Any]], FitReport]:
    """Messages that fit `window` with `max_tokens` left for the reply.

    The first `keep_head` messages (system prompt and task) are never removed.
    """
    budget = budget_for(window, max_tokens, tools)
    before = sum(tokens.count_message(m) for m in messages) + tokens.REPLY_PRIMING
    if before <= budget:
        return messages, FitReport(before, before, 0, 0)
    head, rest = messages[:keep_head], messages[keep_head:]
    groups = _groups(rest, 0)
    note_cost = 24
    total = before + note_cost
    dropped = 0
    # Drop whole groups, oldest first, but always keep the most recent one.
    while total > budget and len(groups) > 1:
        group = groups.pop(0)
        total -= sum(tokens.count_message(rest[i]) for i in group)
        dropped += len(group)
    kept = [dict(rest[i]) for group in groups for i in group]
    trimmed = list(head)
    if dropped:
        trimmed.append({
            "role": "user",
            "content": f"[context note: {dropped} earlier messages were removed to fit the "
                       "context window; repeat a tool call if you need its result again]",
        })
    clipped = 0
    total = sum(tokens.count_message(m) for m in trimmed + kept) + tokens.REPLY_PRIMING
    # Clip the longest tool results, proportionally to how far over the budget we are.
    for message in sorted(kept, key=lambda m: -tokens.count_message(m)):
        if total <= budget:
            break
        if message.get("role") != "tool":
            continue
        content = message.get("content") or ""
        have = tokens.count_text(content)
        for _ in range(4):
            keep_tokens = have - (total - budget) - 32
            if keep_tokens <= 0:
                break
            new_content = clip(content, int(len(content) * keep_tokens / max(have, 1)))
            total -= have - tokens.count_text(new_content)
            content, have = new_content, tokens.count_text(new_content)
            if total <= budget:
                break
        message.update(content=content)
        clipped += 1
    trimmed.extend(kept)
    after = sum(tokens.count_message(m) for m in trimmed) + tokens.REPLY_PRIMING
    if after > budget:
        raise ContextOverflow(
            f"conversation needs {after} tokens but only {budget} fit the window of {window} "
            f"with {max_tokens} reserved for the reply"
        )
    return trimmed, FitReport(before, after, dropped, clipped)
