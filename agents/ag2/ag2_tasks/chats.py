"""The AG2 conversation patterns a task runs in, built from AG2's own agents.

- `tool_chat`: a two-agent chat. An assistant with the corpus tools proposes calls; a user
  proxy executes them and hands back the results until the assistant replies in words.
- `group_chat`: a researcher, a tool executor and a writer under a `GroupChatManager`, which
  chooses each next speaker with the model (speaker selection "auto") among the transitions
  the group allows.
- `sequential`: two chats in a row (`initiate_chats`): a researcher gathers the facts with the
  tools, its chat is summarised by the model, and the summary is carried over to a writer.

Every agent with a model has its own conversation key in `X-Pathfinder-Script`, so the
scripted server plays each role's part.
"""

from __future__ import annotations

import json
import os
import re
import unicodedata
from dataclasses import dataclass
from typing import Any, Callable

from autogen import ConversableAgent, GroupChat, GroupChatManager, LLMConfig, UserProxyAgent
from autogen.agentchat import register_function

from .context import ElideOldToolResults, fit_context, fit_selection
from .patterns import pattern_for  # noqa: F401  (re-exported)
from .tools import TOOLS

MAX_TOOL_ROUNDS = 10
# The completion limit of every model call; the context transform keeps the prompt within the
# window less this.
MAX_TOKENS = 1024

# Only the writer's replies are streamed (AG2 assembles the deltas and the usage chunk). The
# tool-calling roles are not: AG2 0.14 assembles a stream that breaks off before its finish
# reason into a `Choice` with finish_reason None, which pydantic rejects (ValidationError), so
# a provider's cut stream would end the run where a non-streamed call is simply retried.
STREAMED = frozenset({"writer"})
NUDGE_ANSWER = ('Your last reply did not contain a final answer. Reply with only a JSON object '
                'of the form {"answer": "..."}.')
NUDGE_LOOKUP = "You have not looked anything up yet. Use the tools to find the facts the question needs."

ANSWER_RULES = """\
- Use the tools to find every fact you need; do not answer from memory.
- When you know the answer, reply with only a JSON object: {"answer": "..."}.
  Numbers are given without units or thousands separators unless the question asks otherwise.
- If the tools cannot answer the question, reply {"answer": "unknown"}."""

ASSISTANT_SYSTEM = f"""\
You are a careful research assistant that answers questions using tools.

Rules:
{ANSWER_RULES}

Tools available: $tools."""

RESEARCHER_SYSTEM = """\
You are the researcher of a team that answers questions from a document corpus.
Use the tools to find every fact the question needs; do not answer from memory.
When you have found the facts, reply in words with the facts and where they come from,
without calling a tool. The writer then gives the team's answer.

Tools available: $tools."""

WRITER_SYSTEM = """\
You are the writer of a team that answers questions from a document corpus.
The researcher has found the facts in the conversation. Give the final answer from them:
reply with only a JSON object: {"answer": "..."}.
Numbers are given without units or thousands separators unless the question asks otherwise.
If the facts do not answer the question, reply {"answer": "unknown"}."""

SELECTOR_MESSAGE = """\
You coordinate a team answering a question. The team: {roles}.
Read the conversation, then choose who speaks next from {agentlist}:
the executor runs tool calls, the researcher looks up facts, the writer gives the answer once
the researcher has reported the facts. Reply with the name only."""


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
                        script=os.environ.get("PATHFINDER_SCRIPT", "ag2/unknown"), seed=seed)

    def llm_config(self, conversation: str) -> LLMConfig:
        """One AG2 model configuration per conversation (role) of the run."""
        entry: dict[str, Any] = {
            "api_type": "openai",
            "model": self.model,
            "api_key": "pathfinder-local",
            "default_headers": {"X-Pathfinder-Script": f"{self.script}/{conversation}"},
            "max_tokens": MAX_TOKENS,
            # A local model costs nothing; without a price AG2 warns on every call and records
            # no cost at all.
            "price": [0.0, 0.0],
        }
        if conversation in STREAMED:
            entry["stream"] = True

        if self.url.startswith("unix:"):
            import httpx

            entry["base_url"] = "http://pathfinder-llm/v1"
            entry["http_client"] = httpx.Client(transport=httpx.HTTPTransport(uds=self.url[len("unix:"):]))
        else:
            entry["base_url"] = self.url.rstrip("/") + "/v1"
        # cache_seed None: AG2's disk cache stays off, every reply comes from the model.
        return LLMConfig(entry, temperature=0.0, seed=self.seed, cache_seed=None)


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


def has_answer(message: dict[str, Any]) -> bool:
    """A reply that holds the final `{"answer": ...}`."""
    return not message.get("tool_calls") and parse_answer(message.get("content")) is not None


def looked_up(messages: list[dict[str, Any]]) -> bool:
    """Whether any tool result is among `messages`."""
    return any(m.get("role") == "tool" or m.get("tool_responses") for m in messages)


def spoke_in_words(message: dict[str, Any]) -> bool:
    """A reply with text and no tool call: the turn that ends a tool loop."""
    return not message.get("tool_calls") and bool((message.get("content") or "").strip())


def outcome_from(messages: list[dict[str, Any]], speaker: str) -> Outcome:
    """The run's outcome from the last words of `speaker` in `messages`."""
    steps = sum(1 for m in messages if m.get("name") == speaker or m.get("role") == "assistant")
    for message in reversed(messages):
        if message.get("name") in (speaker, None) and spoke_in_words(message):
            answer = parse_answer(message.get("content"))
            if answer is None:
                return Outcome("failed", "", steps, "the final reply holds no {\"answer\": ...}")
            if answer.lower() == "unknown":
                return Outcome("gave_up", answer, steps, "the agents found no answer")
            return Outcome("completed", answer, steps)
    return Outcome("failed", "", steps, f"{speaker} never replied in words")


# --- patterns ---------------------------------------------------------------------------------

def _tools(names: list[str]) -> list[tuple[str, Callable[..., str]]]:
    return [(n, TOOLS[n]) for n in names if n in TOOLS]


def _register(tools: list[tuple[str, Callable[..., str]]], caller: ConversableAgent,
              executor: ConversableAgent) -> None:
    for name, function in tools:
        register_function(function, caller=caller, executor=executor, name=name,
                          description=(function.__doc__ or name).strip())


def _researcher_and_writer(tools: list[tuple[str, Callable[..., str]]],
                           endpoint: Endpoint) -> tuple[ConversableAgent, ConversableAgent]:
    """The two model roles of the group and sequential patterns, each fitting its prompts into
    the context window. The descriptions are what the group chat's speaker selection reads."""
    names = ", ".join(n for n, _ in tools) or "none"
    researcher = ConversableAgent(
        "researcher", llm_config=endpoint.llm_config("researcher"), human_input_mode="NEVER",
        system_message=RESEARCHER_SYSTEM.replace("$tools", names),
        description="Looks up facts in the corpus with the tools and reports them.")
    writer = ConversableAgent(
        "writer", llm_config=endpoint.llm_config("writer"), human_input_mode="NEVER",
        system_message=WRITER_SYSTEM,
        description="Gives the team's final answer once the researcher has reported the facts.")
    for agent in (researcher, writer):
        fit_context(agent, MAX_TOKENS)
    return researcher, writer


def tool_chat(question: str, tool_names: list[str], endpoint: Endpoint,
              instrument: Callable[[Any], Any]) -> Outcome:
    tools = _tools(tool_names)
    assistant = ConversableAgent(
        "assistant", llm_config=endpoint.llm_config("assistant"), human_input_mode="NEVER",
        system_message=ASSISTANT_SYSTEM.replace("$tools", ", ".join(n for n, _ in tools) or "none"))
    # Until the assistant gives its answer, the user proxy runs its tool calls, or asks for the
    # answer again when it replied in words (a reply cut at max_tokens, prose without the JSON).
    user = UserProxyAgent(
        "user", human_input_mode="NEVER", code_execution_config=False, llm_config=False,
        is_termination_msg=has_answer, max_consecutive_auto_reply=MAX_TOOL_ROUNDS,
        default_auto_reply=NUDGE_ANSWER)
    _register(tools, assistant, user)
    fit_context(assistant, MAX_TOKENS)
    instrument(assistant)
    instrument(user)
    result = user.initiate_chat(assistant, message=task_message(question), summary_method="last_msg")
    return outcome_from(result.chat_history, "assistant")


def group_chat(question: str, tool_names: list[str], endpoint: Endpoint,
               instrument: Callable[[Any], Any]) -> Outcome:
    tools = _tools(tool_names)
    researcher, writer = _researcher_and_writer(tools, endpoint)
    executor = UserProxyAgent(
        "executor", human_input_mode="NEVER", code_execution_config=False, llm_config=False,
        description="Runs the researcher's tool calls and returns their results.")
    user = UserProxyAgent("user", human_input_mode="NEVER", code_execution_config=False,
                          llm_config=False, description="Asks the question.")
    _register(tools, researcher, executor)

    def next_speaker(last: Any, group: GroupChat) -> Any:
        """The researcher keeps the floor until it has looked something up (a plan, or a reply
        cut at max_tokens, is not a report); otherwise the manager's model chooses."""
        last_message = group.messages[-1] if group.messages else {}
        if last is researcher and not last_message.get("tool_calls") and not looked_up(group.messages):
            return researcher
        return "auto"

    group = GroupChat(
        agents=[user, researcher, executor, writer], messages=[],
        max_round=2 * MAX_TOOL_ROUNDS + 4, speaker_selection_method=next_speaker,
        allowed_or_disallowed_speaker_transitions={
            user: [researcher], researcher: [executor, writer], executor: [researcher],
            writer: [researcher]},
        speaker_transitions_type="allowed", select_speaker_message_template=SELECTOR_MESSAGE,
        select_speaker_transform_messages=fit_selection(MAX_TOKENS))
    for agent in (user, researcher, executor, writer):
        instrument(agent)
    group = instrument(group)
    manager = GroupChatManager(
        groupchat=group, llm_config=endpoint.llm_config("manager"), human_input_mode="NEVER",
        is_termination_msg=lambda m: m.get("name") == "writer" and spoke_in_words(m))
    instrument(manager)
    user.initiate_chat(manager, message=task_message(question), summary_method="last_msg")
    return outcome_from(group.messages, "writer")


def sequential(question: str, tool_names: list[str], endpoint: Endpoint,
               instrument: Callable[[Any], Any]) -> Outcome:
    tools = _tools(tool_names)
    researcher, writer = _researcher_and_writer(tools, endpoint)

    def reported(message: dict[str, Any]) -> bool:
        """The research chat ends when the researcher reports in words after a lookup."""
        return spoke_in_words(message) and looked_up(user.chat_messages.get(researcher, []))

    user = UserProxyAgent(
        "user", human_input_mode="NEVER", code_execution_config=False, llm_config=False,
        is_termination_msg=reported, max_consecutive_auto_reply=MAX_TOOL_ROUNDS,
        default_auto_reply=NUDGE_LOOKUP)
    _register(tools, researcher, user)
    for agent in (researcher, writer, user):
        instrument(agent)
    results = user.initiate_chats([
        {"recipient": researcher, "message": task_message(question),
         "summary_method": fitted_reflection,
         "summary_args": {"summary_prompt": "Summarise the facts found and their sources."}},
        {"recipient": writer, "message": "Give the answer to the question from the facts above.",
         "summary_method": "last_msg", "max_turns": 1},
    ])
    history = results[-1].chat_history
    return outcome_from(history, "writer")


def fitted_reflection(sender: ConversableAgent, recipient: ConversableAgent,
                      summary_args: dict[str, Any]) -> str:
    """AG2's reflection summary (the model summarises the finished chat), on the chat fitted
    into the context window like every other prompt: AG2's own "reflection_with_llm" sends the
    whole history untransformed, and a long research chat overflows the window."""
    messages = sender.chat_messages_for_summary(recipient)
    fitted = ElideOldToolResults(recipient, MAX_TOKENS).apply_transform(messages)
    return recipient._reflection_with_llm(summary_args["summary_prompt"], fitted, llm_agent=recipient, cache=None)


PATTERNS = {"tool_chat": tool_chat, "group_chat": group_chat, "sequential": sequential}


def task_message(question: str) -> str:
    return f"Question: {question}\n\nAnswer with a JSON object {{\"answer\": ...}} once you are sure."
