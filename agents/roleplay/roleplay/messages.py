"""Messages between roles, and their shape at the model API.

A :class:`BaseMessage` belongs to a role (who said it). Which chat-API role it takes depends
on whose conversation it is in: an agent's own messages are ``assistant`` turns, everyone
else's are ``user`` turns. Tool calls and results keep the function-calling shape.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class RoleType(str, enum.Enum):
    USER = "user"
    ASSISTANT = "assistant"
    CRITIC = "critic"
    TASK_SPECIFIER = "task_specifier"
    DEFAULT = "default"


class BackendRole(str, enum.Enum):
    """The role a message takes in one agent's request."""

    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


@dataclass
class ToolCallRequest:
    call_id: str
    name: str
    arguments: str  # JSON text, exactly as the model produced it


@dataclass
class BaseMessage:
    role_name: str
    role_type: RoleType
    content: str
    tool_calls: list[ToolCallRequest] = field(default_factory=list)
    tool_call_id: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def make_user_message(cls, role_name: str, content: str, **meta: Any) -> "BaseMessage":
        return cls(role_name, RoleType.USER, content, meta=dict(meta))

    @classmethod
    def make_assistant_message(cls, role_name: str, content: str, **meta: Any) -> "BaseMessage":
        return cls(role_name, RoleType.ASSISTANT, content, meta=dict(meta))

    def with_content(self, content: str) -> "BaseMessage":
        return BaseMessage(self.role_name, self.role_type, content, list(self.tool_calls), self.tool_call_id, dict(self.meta))


def to_openai_message(message: BaseMessage, role_at_backend: BackendRole) -> dict[str, Any]:
    """The chat-completions form of ``message`` as seen from one agent's side."""
    if role_at_backend is BackendRole.TOOL:
        if not message.tool_call_id:
            raise ValueError("a tool result needs the id of the call it answers")
        return {"role": "tool", "tool_call_id": message.tool_call_id, "content": message.content}
    out: dict[str, Any] = {"role": role_at_backend.value, "content": message.content}
    if role_at_backend is BackendRole.ASSISTANT and message.tool_calls:
        out["content"] = message.content or None
        out["tool_calls"] = [
            {"id": call.call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
            for call in message.tool_calls
        ]
    return out
