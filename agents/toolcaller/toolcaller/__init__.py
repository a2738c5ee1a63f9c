"""toolcaller: a single-agent function-calling loop in the spirit of Qwen-Agent.

`python3 -m toolcaller --task TASK.json --workdir DIR --trace TRACE.jsonl --seed S`, with the
environment of `agents/CONTRACT.md`. Script conversation keys: `main` only.
"""

__version__ = "0.3.0"
