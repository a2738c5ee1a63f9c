"""Keeping a conversation within the model's context window, as an AG2 message transform.

AG2's `TransformMessages` capability runs its transforms on the messages an agent is about to
send. `ElideOldToolResults` keeps every turn (the scripted model, like a real one, reads its
step from the turns it has taken) and, while the prompt would not fit, replaces the oldest
tool results: first to their head and tail, then to a one-line note. Tokens are counted the way the contract's server counts
them (agents/CONTRACT.md): no tokeniser is downloaded or loaded.
"""

from __future__ import annotations

import copy
import json
import math
import re
from typing import Any

from autogen.agentchat.contrib.capabilities.transform_messages import TransformMessages

WINDOW = 8192
_WORD = re.compile(r"\w+")


def count_text(text: str) -> int:
    """ceil(len/4) per run of word characters, 1 per other non-space character."""
    tokens = 0
    for piece in re.findall(r"\w+|\S", text):
        tokens += math.ceil(len(piece) / 4) if _WORD.fullmatch(piece) else 1
    return tokens


def count_message(message: dict[str, Any]) -> int:
    """Tokens of a message as it goes over the wire: AG2 sends each of a tool message's
    `tool_responses` as a message of its own, in place of the combined `content`."""
    responses = message.get("tool_responses")
    if responses:
        return sum(count_message({"role": "tool", **r}) for r in responses)
    tokens = 3 + count_text(str(message.get("role", "")))
    content = message.get("content")
    if isinstance(content, str):
        tokens += count_text(content)
    elif content is not None:
        tokens += count_text(json.dumps(content, ensure_ascii=False))
    for key in ("name", "tool_call_id"):
        if message.get(key):
            tokens += count_text(str(message[key]))
    for call in message.get("tool_calls") or []:
        function = call.get("function", {})
        tokens += count_text(str(function.get("name", ""))) + count_text(str(function.get("arguments", "")))
    return tokens


CLIP_CHARS = 600
ELIDED = "[result elided to save context]"


def head_and_tail(text: str, chars: int) -> str:
    """The head and tail of a long tool result, saying how much was left out."""
    if len(text) <= chars:
        return text
    head, tail = text[: chars * 2 // 3], text[-(chars // 3):]
    return f"{head}\n[... {len(text) - len(head) - len(tail)} characters elided to save context ...]\n{tail}"


def _rewrite(message: dict[str, Any], shorten) -> None:
    if isinstance(message.get("content"), str):
        message["content"] = shorten(message["content"])
    for response in message.get("tool_responses") or []:
        if isinstance(response.get("content"), str):
            response["content"] = shorten(response["content"])


class ElideOldToolResults:
    """A `MessageTransform`: shortens, then elides, the oldest tool results until the prompt fits."""

    # What speaker selection adds around the transcript (its system message and prompt), for a
    # transform with no agent of its own.
    SELECTION_RESERVE = 600

    def __init__(self, agent: Any | None, completion_tokens: int, window: int = WINDOW) -> None:
        self.agent = agent
        self.completion_tokens = completion_tokens
        self.window = window

    def budget(self) -> int:
        """Tokens left for the messages: the window less the completion, the system message
        and the tool definitions the agent sends with them."""
        if self.agent is None:
            return self.window - self.completion_tokens - self.SELECTION_RESERVE
        system = sum(count_message(m) for m in self.agent._oai_system_message)
        tools = (self.agent.llm_config or {}).get("tools") if self.agent.llm_config else None
        tool_tokens = count_text(json.dumps(tools, separators=(",", ":"))) if tools else 0
        return self.window - self.completion_tokens - system - tool_tokens - 16

    def apply_transform(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = copy.deepcopy(messages)
        budget = self.budget()
        # The task (first) and what the model must answer now (last) stay as they are. First
        # the oldest long tool results are cut to their head and tail, then elided whole.
        older = [m for m in out[1:-1] if m.get("role") == "tool" or m.get("tool_responses")]
        total = sum(count_message(m) for m in out)
        for shorten in (lambda text: head_and_tail(text, CLIP_CHARS), lambda text: ELIDED):
            for message in older:
                if total <= budget:
                    return out
                before = count_message(message)
                _rewrite(message, shorten)
                total -= before - count_message(message)
        return out

    def get_logs(self, pre: list[dict[str, Any]], post: list[dict[str, Any]]) -> tuple[str, bool]:
        changed = sum(1 for a, b in zip(pre, post) if a.get("content") != b.get("content"))
        return f"{changed} tool results shortened to fit the context window.", changed > 0


def fit_context(agent: Any, completion_tokens: int) -> None:
    """Gives `agent` the capability of fitting its prompts into the window."""
    TransformMessages(transforms=[ElideOldToolResults(agent, completion_tokens)], verbose=False).add_to_agent(agent)


def fit_selection(completion_tokens: int) -> TransformMessages:
    """The transform a group chat applies to the transcript its speaker selection reads."""
    return TransformMessages(transforms=[ElideOldToolResults(None, completion_tokens)], verbose=False)
