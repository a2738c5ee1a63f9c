"""A deep-research agent in the spirit of Open Deep Research, Python standard library only.

A planner splits the question into sub-questions, parallel asyncio researchers answer them
with local tools, a writer drafts a report and a reviewer may send the team back for another
round. See README.md for the architecture and agent.toml for the component map.
"""

__version__ = "0.3.0"
