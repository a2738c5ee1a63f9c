"""The agent loop with a scripted in-memory model."""

import json
import sys
import tempfile
import unittest
from pathlib import Path

from swe.agent import Agent
from swe.config import AgentConfig
from swe.environment import SWEEnvironment
from swe.hooks import FirstStepReporter, HookRegistry, ProgressReporter, TrajectoryRecorder
from swe.llm import ModelResponse, ToolCall
from swe.tokens import TokenCounter, UsageTracker
from swe.tracing import Tracer


class ScriptedLLM:
    """Plays replies in order; records the messages it was sent."""

    def __init__(self, replies):
        self.replies = list(replies)
        self.requests = []
        self.usage = UsageTracker(0.003, 0.015)
        self.counter = TokenCounter()

    def chat(self, messages, tools=None, conversation="main"):
        self.requests.append(messages)
        reply = self.replies[min(len(self.requests) - 1, len(self.replies) - 1)]
        self.usage.add(self.counter.count_messages(messages), 10)
        return reply


def text(command, thought="Next."):
    return ModelResponse(f"DISCUSSION\n{thought}\n\n```\n{command}\n```")


class AgentLoopTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        root = Path(self.tmp.name)
        self.repo = root / "repo"
        (self.repo / "pkg").mkdir(parents=True)
        (self.repo / "pkg" / "mod.py").write_text("def double(x):\n    return x + x + 1\n", encoding="utf-8")
        self.trace = root / "trace.jsonl"
        self.trajectory = root / "trajectory.json"
        self.task = {"id": "t-1", "issue": "double(2) returns 5 {not 4}", "test_command": f"{sys.executable} -m unittest -q", "files": ["pkg/mod.py"]}

    def tearDown(self):
        self.tmp.cleanup()

    def run_agent(self, replies, **config_changes):
        config = AgentConfig(**config_changes)
        tracer = Tracer(self.trace, "swe")
        llm = ScriptedLLM(replies)
        hooks = HookRegistry()
        hooks.add(TrajectoryRecorder(self.trajectory))
        hooks.add(FirstStepReporter(hooks, tracer))
        hooks.add(ProgressReporter(tracer, llm.usage))
        self.hooks = hooks
        agent = Agent(config, self.task, SWEEnvironment(self.repo, self.task["test_command"], config), llm, tracer, hooks)
        result = agent.run()
        tracer.flush()
        return agent, llm, result

    def test_format_error_is_answered_and_the_run_completes(self):
        replies = [
            ModelResponse("I think I should open the file."),
            text("open pkg/mod.py"),
            ModelResponse("", [ToolCall("c1", "edit", json.dumps({"start_line": 2, "end_line": 2, "replacement_text": "    return x + x"}))], "tool_calls"),
            text("submit"),
            text("submit"),
        ]
        agent, llm, result = self.run_agent(replies)
        self.assertEqual((result.status, result.exit_reason, result.steps), ("completed", "submitted", 4))
        self.assertIn("+    return x + x\n", result.submission)
        # Every model call is an assistant turn of the next request.
        for n, messages in enumerate(llm.requests):
            self.assertEqual(sum(m["role"] == "assistant" for m in messages), n)
        self.assertIn("not formatted correctly", llm.requests[1][-1]["content"])
        self.assertEqual(llm.requests[3][-1]["role"], "tool")
        self.assertIn("{not 4}", llm.requests[0][1]["content"])
        spans = [json.loads(line) for line in self.trace.read_text().splitlines()]
        parse_errors = [s for s in spans if s["name"] == "agent.parse_action" and s["status"]["code"] == "ERROR"]
        self.assertEqual(len(parse_errors), 1)
        self.assertEqual(len([s for s in spans if s["name"] == "agent.progress"]), 4)
        # The one-shot hook reported the first step and left without costing the progress
        # reporter after it its first span.
        self.assertEqual(len([s for s in spans if s["name"] == "agent.first_step"]), 1)
        self.assertEqual(len(self.hooks), 2)
        self.assertEqual(json.loads(self.trajectory.read_text())["status"], "completed")

    def test_step_limit_autosubmits_current_changes(self):
        replies = [text("open pkg/mod.py"), text("edit 2:2\n    return 2 * x\nend_of_edit"), text("scroll_down")]
        agent, llm, result = self.run_agent(replies, step_limit=3)
        self.assertEqual((result.status, result.exit_reason, result.steps), ("gave_up", "step_limit", 3))
        self.assertIn("+    return 2 * x\n", result.submission)
        self.assertIn("step(s) remain", llm.requests[2][-1]["content"])

    def test_repeated_format_errors_give_up(self):
        agent, llm, result = self.run_agent([ModelResponse("no command here")], max_format_retries=2)
        self.assertEqual((result.status, result.exit_reason), ("gave_up", "format_errors"))
        self.assertEqual(len(llm.requests), 3)


if __name__ == "__main__":
    unittest.main()
