"""The agent: a Pydantic AI `Agent` over an OpenAI-compatible chat-completions server."""

from __future__ import annotations

from dataclasses import dataclass, replace

from openai import AsyncOpenAI
from pydantic_ai import Agent, ModelRetry
from pydantic_ai.capabilities import ProcessHistory
from pydantic_ai.messages import ModelMessage, ModelRequest, ToolReturnPart
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.settings import ModelSettings
from pydantic_ai.usage import UsageLimits

from .answer import parse_answer
from .tools import all_tools

INSTRUCTIONS = """You answer questions about a corpus of documents and CSV tables.
Use the tools to find the facts; never guess a number or a name.
When you know the answer, reply with JSON only: {{"answer": <value>}}.

Question: {question}"""

# Old tool outputs longer than this are replaced by a short note before each request.
COMPRESS_ABOVE_CHARS = 300
# The most recent requests whose tool outputs are always kept whole.
KEEP_RECENT_REQUESTS = 1


@dataclass
class Settings:
    """Where the model is and how the agent calls it."""

    base_url: str
    model: str = "scripted"
    script_key: str | None = None
    max_retries: int = 3
    timeout_s: float = 60.0


def instructions_for(question: str) -> str:
    """The system instructions with the task's question filled in."""
    return INSTRUCTIONS.format(question=question)


def compress_history(messages: list[ModelMessage]) -> list[ModelMessage]:
    """Keeps long histories small: tool outputs of older requests become a one-line note.
    Every tool call keeps its return part, so the conversation stays well formed."""
    requests = [i for i, m in enumerate(messages) if isinstance(m, ModelRequest)]
    old = set(requests[:-KEEP_RECENT_REQUESTS]) if len(requests) > KEEP_RECENT_REQUESTS else set()
    out: list[ModelMessage] = []
    for i, message in enumerate(messages):
        if i in old:
            parts = []
            for part in message.parts:
                if isinstance(part, ToolReturnPart) and len(str(part.content)) > COMPRESS_ABOVE_CHARS:
                    note = f"[{part.tool_name} output of {len(str(part.content))} characters, shown earlier]"
                    part = replace(part, content=note)
                parts.append(part)
            message = replace(message, parts=parts)
        out.append(message)
    return out


def model_settings() -> ModelSettings:
    """Sampling settings for every request."""
    return ModelSettings(temperature=0.2, max_tokens=1024)


def usage_limits() -> UsageLimits:
    """How many model requests a run may make before it is stopped."""
    return UsageLimits(request_limit=12)


def build_agent(settings: Settings) -> Agent:
    headers = {"X-Pathfinder-Script": settings.script_key} if settings.script_key else None
    client = AsyncOpenAI(
        base_url=settings.base_url,
        api_key="not-needed",
        default_headers=headers,
        max_retries=settings.max_retries,
        timeout=settings.timeout_s,
    )
    model = OpenAIChatModel(settings.model, provider=OpenAIProvider(openai_client=client))
    agent = Agent(
        model,
        name="qa_agent",
        tools=all_tools(),
        model_settings=model_settings(),
        retries=3,
        capabilities=[ProcessHistory(compress_history)],
    )
    agent.output_validator(require_answer)
    return agent


def require_answer(output: str) -> str:
    """A final reply must carry the answer object; otherwise the model is asked again."""
    try:
        parse_answer(output)
    except (ValueError, KeyError) as err:
        raise ModelRetry(f'reply with JSON only, {{"answer": <value>}} ({err})') from None
    return output
