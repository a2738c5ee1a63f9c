"""The whole society against a small in-process chat-completions server."""

import json
import tempfile
import threading
import unittest
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from roleplay.cli import main

SCRIPT = {
    "task_specifier": [{"content": json.dumps({"specified_task": "Find the year.", "subgoals": ["read {history}"], "answer_format": "a year"})}],
    "user": [{"content": "Instruction: Read the history.\nInput: None"},
             {"content": "Instruction: Give the final answer.\nInput: None"},
             {"content": "<TASK_DONE>"}],
    "assistant": [{"tool_calls": [{"name": "read_file", "arguments": {"path": "town/history.md"}},
                                  {"name": "calculator", "arguments": {"expression": "1870 + 1"}}]},
                  {"content": "Solution: completed in 1871.\nNext request."},
                  {"content": "```json\n{\"final_answer\": \"1871\", \"evidence\": \"town/history.md\"}\n```"}],
    "critic": [{"content": json.dumps({"verdict": "accept", "reason": "supported"})}],
}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        conversation = self.headers["X-Pathfinder-Script"].split("/")[-1]
        steps = SCRIPT[conversation]
        turn = sum(1 for m in request["messages"] if m["role"] == "assistant")
        step = steps[min(turn, len(steps) - 1)]
        calls = [{"id": f"call_{turn}_{i}", "type": "function", "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])}}
                 for i, c in enumerate(step.get("tool_calls", []))] if request.get("tools") else []
        content = step.get("content")
        finish = "tool_calls" if calls else "stop"
        if not request.get("stream"):
            body = json.dumps({"choices": [{"message": {"role": "assistant", "content": content, "tool_calls": calls or None}, "finish_reason": finish}],
                               "usage": {"prompt_tokens": 10, "completion_tokens": 5}}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        events = []
        for i in range(0, len(content or ""), 5):
            events.append({"choices": [{"delta": {"content": content[i:i + 5]}}]})
        for i, call in enumerate(calls):
            args = call["function"]["arguments"]
            events.append({"choices": [{"delta": {"tool_calls": [{"index": i, "id": call["id"], "function": {"name": call["function"]["name"], "arguments": args[:4]}}]}}]})
            events.append({"choices": [{"delta": {"tool_calls": [{"index": i, "function": {"arguments": args[4:]}}]}}]})
        events.append({"choices": [{"delta": {}, "finish_reason": finish}]})
        events.append({"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 5}})
        body = "".join(f"data: {json.dumps(e)}\n\n" for e in events).encode() + b"data: [DONE]\n\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class SocietyRunTest(unittest.TestCase):
    def test_run_writes_result_and_trace(self):
        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            with tempfile.TemporaryDirectory() as tmp:
                root = Path(tmp)
                (root / "corpus" / "town").mkdir(parents=True)
                (root / "corpus" / "tables").mkdir()
                (root / "corpus" / "town" / "history.md").write_text("Completed in 1871.\n", encoding="utf-8")
                task = root / "gaia-x.json"
                task.write_text(json.dumps({"id": "gaia-x", "question": "When?", "tools": ["read_file", "calculator"]}), encoding="utf-8")
                import os
                from unittest import mock

                env = {"PATHFINDER_LLM_URL": f"http://127.0.0.1:{server.server_address[1]}", "PATHFINDER_CORPUS": str(root / "corpus"),
                       "PATHFINDER_SCRIPT": "roleplay/gaia-x"}
                with mock.patch.dict(os.environ, env):
                    code = main(["--task", str(task), "--workdir", str(root / "work"), "--trace", str(root / "trace.jsonl"), "--seed", "1"])
                result = json.loads((root / "work" / "result.json").read_text())
                spans = [json.loads(line) for line in (root / "trace.jsonl").read_text().splitlines()]
        finally:
            server.shutdown()
            server.server_close()
        self.assertEqual(code, 0)
        self.assertEqual((result["status"], result["answer"], result["steps"]), ("completed", "1871", 3))
        root_span = spans[0]
        self.assertEqual(root_span["name"], "agent.run")
        self.assertEqual(root_span["attributes"]["pathfinder.outcome"], "completed")
        tools = [s for s in spans if s["kind"] == "tool"]
        self.assertEqual([s["name"] for s in tools], ["execute_tool read_file", "execute_tool calculator"])
        self.assertEqual(tools[0]["attributes"]["code.function"], "CorpusToolkit.read_file")
        for span in spans:
            for key in ("code.filepath", "code.function", "code.lineno", "gen_ai.agent.name", "pathfinder.step_index"):
                self.assertIn(key, span["attributes"], span["name"])


if __name__ == "__main__":
    unittest.main()
