"""The society's roles and their generated system prompts.

Each role has a name, a type (which template it uses) and the conversation key under which
its model calls are made. Role prompts are generated in two passes: role names when the
society is assembled, task and plan once the task has been specified.
"""

from __future__ import annotations

from dataclasses import dataclass

from .messages import RoleType
from .prompts import PromptTemplateGenerator, TextPrompt

DONE_TOKEN = "<TASK_DONE>"


@dataclass(frozen=True)
class RoleSpec:
    name: str
    role_type: RoleType
    conversation: str  # the CONVERSATION part of the X-Pathfinder-Script key
    description: str


@dataclass(frozen=True)
class RoleCast:
    user: RoleSpec
    assistant: RoleSpec
    critic: RoleSpec
    specifier: RoleSpec

    def names(self) -> dict[str, str]:
        return {
            "user_role": self.user.name,
            "assistant_role": self.assistant.name,
            "critic_role": self.critic.name,
            "specifier_role": self.specifier.name,
        }


def default_cast() -> RoleCast:
    return RoleCast(
        user=RoleSpec("Research Coordinator", RoleType.USER, "user", "Breaks the question into instructions and decides when it is answered."),
        assistant=RoleSpec("Corpus Analyst", RoleType.ASSISTANT, "assistant", "Carries out instructions with the corpus tools and reports facts with sources."),
        critic=RoleSpec("Fact Checker", RoleType.CRITIC, "critic", "Checks the final answer against the gathered evidence."),
        specifier=RoleSpec("Task Specifier", RoleType.TASK_SPECIFIER, "task_specifier", "Makes the question specific and plans it."),
    )


def role_prompt_templates(cast: RoleCast) -> dict[RoleType, TextPrompt]:
    """First pass: every role's system prompt with the role names filled in."""
    generator = PromptTemplateGenerator()
    names = dict(cast.names(), done_token=DONE_TOKEN)
    return {
        RoleType.USER: generator.get_system_prompt("user").format(**names),
        RoleType.ASSISTANT: generator.get_system_prompt("assistant").format(**names),
        RoleType.CRITIC: generator.get_system_prompt("critic").format(**names),
        RoleType.TASK_SPECIFIER: generator.get_system_prompt("task_specifier").format(**names),
    }
