"""Runs the whole agent as a subprocess against an in-process fake chat-completions server.

The fake plays a fixed conversation per script key, streams it in small SSE chunks (tool-call
arguments split mid-token, JSON content in a markdown fence) and fails the first request of
one conversation with HTTP 503, so planning, parallel research, tools, retries, writing,
review and tracing are exercised end to end, over TCP and over a Unix socket.
"""

import json
import os
import socketserver
import subprocess
import sys
import tempfile
import threading
import unittest
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tests.test_tools import make_corpus

AGENT_ROOT = Path(__file__).resolve().parent.parent


def step(content=None, calls=()):
    return {"content": content, "calls": [(n, json.dumps(a, ensure_ascii=False)) for n, a in calls]}


SCRIPT = {
    "planner": [step("```json\n" + json.dumps({"sections": [{"title": "Mill", "questions": [
        "In what year did the Northgate mill open?", "In what year did the mill close?"]}],
        "combine": "Subtract."}) + "\n```")],
    "researcher-0": [step(calls=[("search", {"query": "mill opened", "limit": None})]),
                     step(calls=[("read_file", {"path": "town/mill.md"})]),
                     step(json.dumps({"answer": 1851, "evidence": "opened in 1851",
                                      "sources": ["town/mill.md"], "confidence": "high"}))],
    "researcher-1": [step(calls=[("calculator", {"expression": "1900 + 23"}),
                                 ("table_lookup", {"table": "PRICES", "where": {
                                     "column": "price", "value": 1.8, "match": "Exact"}})]),
                     step("Here it is: " + json.dumps({"answer": "1923", "evidence": "closed 1923",
                                                      "sources": ["town/mill.md"]}))],
    "writer": [step("# Report\nOpened 1851, closed 1923.\n\n**Final answer:** 72.")],
    "reflect": [step(json.dumps({"verdict": "accept", "issues": [], "follow_up": []}))],
}


class FakeServer(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    failed_once: set = set()
    requests: list = []

    def log_message(self, *args):
        pass

    def address_string(self):
        return "test"

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        key = self.headers["X-Pathfinder-Script"]
        conversation = key.split("/")[-1]
        FakeServer.requests.append((key, body))
        if conversation == "researcher-1" and key not in FakeServer.failed_once:
            FakeServer.failed_once.add(key)
            data = json.dumps({"error": {"message": "overloaded", "type": "server_error"}}).encode()
            self.send_response(503)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        turns = sum(1 for m in body["messages"] if m["role"] == "assistant")
        steps = SCRIPT[conversation]
        play = steps[min(turns, len(steps) - 1)]
        events = [{"choices": [{"index": 0, "delta": {"role": "assistant"}}]}]
        text = play["content"] or ""
        events += [{"choices": [{"index": 0, "delta": {"content": text[i:i + 5]}}]}
                   for i in range(0, len(text), 5)]
        for index, (name, args) in enumerate(play["calls"]):
            events.append({"choices": [{"index": 0, "delta": {"tool_calls": [
                {"index": index, "id": f"call_{turns}_{index}", "type": "function",
                 "function": {"name": name, "arguments": ""}}]}}]})
            events += [{"choices": [{"index": 0, "delta": {"tool_calls": [
                {"index": index, "function": {"arguments": args[i:i + 3]}}]}}]}
                for i in range(0, len(args), 3)]
        finish = "tool_calls" if play["calls"] else "stop"
        events.append({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
        events.append({"choices": [], "usage": {"prompt_tokens": 100, "completion_tokens": 10}})
        payload = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
        payload += b": keep-alive\n\ndata: [DONE]\n\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


class UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


class EndToEndTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        root = Path(cls.tmp.name)
        (root / "corpus").mkdir()
        make_corpus(root / "corpus")
        cls.task = root / "task.json"
        cls.task.write_text(json.dumps({"id": "e2e-001", "question": "How long did the mill run?",
                                        "answer": "72", "answer_type": "number"}))
        cls.tcp = ThreadingHTTPServer(("127.0.0.1", 0), FakeServer)
        cls.sock = str(root / "llm.sock")
        cls.unix = UnixServer(cls.sock, FakeServer)
        for server in (cls.tcp, cls.unix):
            threading.Thread(target=server.serve_forever, daemon=True).start()

    @classmethod
    def tearDownClass(cls):
        for server in (cls.tcp, cls.unix):
            server.shutdown()
            server.server_close()
        cls.tmp.cleanup()

    def run_agent(self, url, name, seed=5):
        root = Path(self.tmp.name)
        env = dict(os.environ, PATHFINDER_LLM_URL=url, PATHFINDER_CORPUS=str(root / "corpus"),
                   PATHFINDER_SCRIPT="research/e2e-001")
        proc = subprocess.run(
            [sys.executable, "-m", "research", "--task", str(self.task), "--workdir",
             str(root / name), "--trace", str(root / f"{name}.jsonl"), "--seed", str(seed)],
            cwd=AGENT_ROOT, env=env, capture_output=True, text=True, timeout=60)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        result = json.loads((root / name / "result.json").read_text())
        spans = [json.loads(line) for line in (root / f"{name}.jsonl").read_text().splitlines()]
        return result, spans

    @staticmethod
    def without_ids(spans):
        drop = {"trace_id", "span_id", "parent_span_id", "start_time_unix_nano",
                "end_time_unix_nano"}
        return [{k: v for k, v in s.items() if k not in drop} for s in spans]

    def test_tcp_and_unix_runs_answer_and_trace_identically(self):
        FakeServer.failed_once.clear()
        result, spans = self.run_agent(f"http://127.0.0.1:{self.tcp.server_address[1]}", "tcp")
        self.assertEqual(result, {"task_id": "e2e-001", "status": "completed", "answer": "72",
                                  "steps": 8})
        root = spans[0]
        self.assertEqual((root["name"], root["kind"], root["parent_span_id"]),
                         ("agent.run", "agent", None))
        self.assertEqual(root["attributes"]["pathfinder.outcome"], "completed")
        for span in spans:
            for key in ("code.filepath", "code.function", "code.lineno", "gen_ai.agent.name",
                        "pathfinder.step_index"):
                self.assertIn(key, span["attributes"], span["name"])
            self.assertTrue((AGENT_ROOT / span["attributes"]["code.filepath"]).is_file())
        tools = [s for s in spans if s["kind"] == "tool"]
        self.assertEqual([s["attributes"]["gen_ai.tool.name"] for s in tools],
                         ["search", "read_file", "calculator", "table_lookup"])
        self.assertTrue(all(s["status"]["code"] == "OK" for s in tools))
        self.assertIn('"saffron bun"', tools[3]["attributes"]["output.value"])
        retries = [s for s in spans if s["name"] == "llm.retry"]
        self.assertEqual(len(retries), 1)
        self.assertEqual(retries[0]["attributes"]["gen_ai.agent.name"], "researcher-1")
        headers = {key for key, _ in FakeServer.requests}
        self.assertIn("research/e2e-001/researcher-1", headers)
        self.assertTrue(all(body["seed"] == 5 and body["stream"] for _, body in FakeServer.requests))

        FakeServer.failed_once.clear()
        again, unix_spans = self.run_agent(f"unix:{self.sock}", "unix")
        self.assertEqual(again, result)
        self.assertEqual(self.without_ids(unix_spans), self.without_ids(spans))

    def test_bad_task_file_is_reported(self):
        root = Path(self.tmp.name)
        bad = root / "bad.json"
        bad.write_text('{"id": "x",\n "question": }')
        proc = subprocess.run(
            [sys.executable, "-m", "research", "--task", str(bad), "--workdir", str(root / "bad"),
             "--trace", str(root / "bad.jsonl")], cwd=AGENT_ROOT, capture_output=True, text=True,
            env=dict(os.environ, PATHFINDER_LLM_URL="http://127.0.0.1:9",
                     PATHFINDER_CORPUS=str(root / "corpus")), timeout=60)
        self.assertEqual(proc.returncode, 2)
        self.assertIn("bad.json: invalid JSON at line 2", proc.stderr)
        root_span = json.loads((root / "bad.jsonl").read_text().splitlines()[0])
        self.assertEqual(root_span["status"]["code"], "ERROR")
        self.assertEqual(root_span["attributes"]["pathfinder.outcome"], "crashed")


if __name__ == "__main__":
    unittest.main()
