"""The Pydantic AI agent a task runs on, and how its run becomes the contract's result.

One `Agent` over an OpenAI-compatible chat-completions model (`OpenAIChatModel` on the
contract's endpoint) with the task's corpus tools, an output validator that asks the model
again when its final reply holds no `{"answer": ...}`, and a history processor that fits the
prompt into the context window (`context.fit_history`). The agent's conversation is the
script key's `main` conversation.
"""

from __future__ import annotations

import json
import os
import re
import unicodedata
from dataclasses import dataclass
from typing import Any

from pydantic_ai import Agent, ModelRetry
from pydantic_ai.capabilities import ProcessHistory
from pydantic_ai.exceptions import AgentRunError, UsageLimitExceeded
from pydantic_ai.settings import ModelSettings
from pydantic_ai.usage import UsageLimits

from .context import fit_history
from .tools import TOOLS

CONVERSATION = "main"
# The completion limit of every model call; the history processor keeps the prompt within the
# window less this.
MAX_TOKENS = 1024
# Model requests a run may make (tool rounds, retries of a reply without an answer).
REQUEST_LIMIT = 14
# Retries of one tool, or of the output, before Pydantic AI gives up on the run.
RETRIES = 3

NUDGE_ANSWER = ('Your last reply did not contain a final answer. Reply with only a JSON object '
                'of the form {"answer": "..."}.')


def system_prompt(tools: str) -> str:
    """The agent's instructions: its role, the rules of the task and the tools it has."""
    rules = """\
- Use the tools to find every fact you need; do not answer from memory.
- When you know the answer, reply with only a JSON object: {"answer": "..."}.
  Numbers are given without units or thousands separators unless the question asks otherwise.
- If the tools cannot answer the question, reply {"answer": "unknown"}."""
    return f"You are a careful research assistant that answers questions using tools.\n\nRules:\n{rules}\n\nTools available: {tools}."


def task_message(question: str) -> str:
    return f"Question: {question}\n\nAnswer with a JSON object {{\"answer\": ...}} once you are sure."


@dataclass
class Outcome:
    status: str   # completed | failed | gave_up
    answer: str
    steps: int
    reason: str = ""


# --- the model endpoint ---------------------------------------------------------------------

@dataclass
class Endpoint:
    url: str
    model: str
    script: str
    seed: int

    @staticmethod
    def from_env(seed: int) -> "Endpoint":
        url = os.environ.get("PATHFINDER_LLM_URL", "")
        if not url:
            raise ValueError("PATHFINDER_LLM_URL is not set (http://HOST:PORT or unix:/path)")
        return Endpoint(url=url, model=os.environ.get("PATHFINDER_MODEL", "pathfinder-scripted"),
                        script=os.environ.get("PATHFINDER_SCRIPT", "pydantic-ai/unknown"), seed=seed)

    def model_for(self, conversation: str):
        """Pydantic AI's chat-completions model on the endpoint, sending the script key."""
        import httpx2
        from openai import AsyncOpenAI
        from pydantic_ai.models.openai import OpenAIChatModel
        from pydantic_ai.providers.openai import OpenAIProvider

        http_client = None
        base_url = self.url.rstrip("/") + "/v1"
        if self.url.startswith("unix:"):
            base_url = "http://pathfinder-llm/v1"
            http_client = httpx2.AsyncClient(transport=httpx2.AsyncHTTPTransport(uds=self.url[len("unix:"):]))
        client = AsyncOpenAI(
            base_url=base_url,
            api_key="pathfinder-local",
            default_headers={"X-Pathfinder-Script": f"{self.script}/{conversation}"},
            http_client=http_client,
            timeout=120.0,
        )
        return OpenAIChatModel(self.model, provider=OpenAIProvider(openai_client=client))

    def settings(self) -> ModelSettings:
        return ModelSettings(temperature=0.0, max_tokens=MAX_TOKENS, seed=self.seed)


# --- answers ----------------------------------------------------------------------------------

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\r?\n(.*?)\r?\n?```", re.DOTALL)


def extract_json(text: str | None) -> Any | None:
    """The first JSON value in `text`: whole, fenced, or the first balanced {...}."""
    if not text:
        return None
    try:
        return json.loads(text.strip())
    except ValueError:
        pass
    for match in _FENCE.finditer(text):
        if match.group(1).lower() in ("", "json"):
            try:
                return json.loads(match.group(2).strip())
            except ValueError:
                continue
    decoder = json.JSONDecoder()
    for i, ch in enumerate(text):
        if ch in "{[":
            try:
                return decoder.raw_decode(text, i)[0]
            except ValueError:
                continue
    return None


def parse_answer(content: Any) -> str | None:
    """The answer of a final `{"answer": ...}` reply, normalised; None when there is none."""
    data = extract_json(content if isinstance(content, str) else None)
    if not isinstance(data, dict) or "answer" not in data:
        return None
    answer = data["answer"]
    if isinstance(answer, float) and answer.is_integer():
        answer = int(answer)
    if isinstance(answer, (list, tuple)):
        answer = ", ".join(str(a) for a in answer)
    text = unicodedata.normalize("NFC", str(answer))
    return " ".join(text.split())


def outcome_from(output: str | None, steps: int) -> Outcome:
    answer = parse_answer(output)
    if answer is None:
        return Outcome("failed", "", steps, "the final reply holds no {\"answer\": ...}")
    if answer.lower() == "unknown":
        return Outcome("gave_up", answer, steps, "the agent found no answer")
    return Outcome("completed", answer, steps)


# --- the agent --------------------------------------------------------------------------------

def require_answer(output: str) -> str:
    """The output validator: a final reply must hold the answer object."""
    if parse_answer(output) is None:
        raise ModelRetry(NUDGE_ANSWER)
    return output


def build_agent(tool_names: list[str], endpoint: Endpoint) -> Agent:
    tools = [TOOLS[n] for n in tool_names if n in TOOLS]
    names = ", ".join(t.__name__ for t in tools) or "none"
    agent = Agent(
        endpoint.model_for(CONVERSATION),
        name="assistant",
        instructions=system_prompt(names),
        tools=tools,
        model_settings=endpoint.settings(),
        retries=RETRIES,
        capabilities=[ProcessHistory(lambda messages: fit_history(messages, MAX_TOKENS))],
    )
    agent.output_validator(require_answer)
    return agent


def run_task(question: str, tool_names: list[str], endpoint: Endpoint) -> Outcome:
    agent = build_agent(tool_names, endpoint)
    try:
        result = agent.run_sync(task_message(question),
                                usage_limits=UsageLimits(request_limit=REQUEST_LIMIT))
    except UsageLimitExceeded as exc:
        return Outcome("failed", "", REQUEST_LIMIT, f"{type(exc).__name__}: {exc}")
    except AgentRunError as exc:
        # The model or a tool failed past Pydantic AI's retries; the run ends without an answer.
        return Outcome("failed", "", 0, f"{type(exc).__name__}: {exc}")
    return outcome_from(result.output, result.usage.requests)
