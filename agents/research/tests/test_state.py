import asyncio
import json
import tempfile
import unittest
from pathlib import Path

from research.context import ContextOverflow, fit_messages
from research.events import EventBus, RunStatistics
from research.findings import Finding, FindingsStore
from research.aggregate import aggregate, compress_findings
from research.tokens import count_message
from research.tracing import Tracer, agent_scope


def finding(researcher, round_no, qid, answer, confidence="high", status="ok"):
    return Finding(researcher, round_no, qid, f"question {qid}", answer, f"evidence {answer}",
                   ("doc.md",), confidence, status)


class FindingsStoreTest(unittest.TestCase):
    def test_concurrent_adds_lose_nothing_and_read_in_plan_order(self):
        async def scenario():
            bus = EventBus()

            async def slow(event, **_):
                await asyncio.sleep(0)

            bus.on("finding.added", slow)
            store = FindingsStore(bus)
            await asyncio.gather(*(store.add(finding(i, 1, f"q{i}", str(i))) for i in
                                   reversed(range(8))))
            return store

        store = asyncio.run(scenario())
        self.assertEqual([f.researcher for f in store.snapshot()], list(range(8)))

    def test_retrieve_only_earlier_rounds(self):
        async def scenario():
            store = FindingsStore(EventBus())
            await store.add(finding(0, 1, "q1", "1847"))
            await store.add(finding(1, 2, "q2", "1902"))
            return store.retrieve("question q1 q2 evidence", before_round=2)

        self.assertEqual([f.answer for f in asyncio.run(scenario())], ["1847"])

    def test_capacity_evicts_failed_first(self):
        async def scenario():
            store = FindingsStore(EventBus(), capacity=2)
            await store.add(finding(0, 1, "q0", "a"))
            await store.add(finding(1, 1, "q1", "", "none", "failed"))
            await store.add(finding(2, 1, "q2", "c"))
            return store

        store = asyncio.run(scenario())
        self.assertEqual([f.researcher for f in store.snapshot()], [0, 2])
        self.assertEqual(store.evicted, 1)


class AggregateTest(unittest.TestCase):
    def test_conflict_resolution_prefers_confidence_then_later_round(self):
        agg = aggregate([finding(0, 1, "q1", "1869", "medium"), finding(3, 2, "q1", "1871", "high"),
                         finding(1, 1, "q2", "", "none", "failed")])
        self.assertEqual([f.answer for f in agg.findings], ["1871", ""])
        self.assertEqual(len(agg.conflicts), 1)
        self.assertIn("1869", agg.conflicts_text())
        self.assertEqual(len(agg.missing), 1)
        same = aggregate([finding(0, 1, "q1", "64.5"), finding(1, 2, "q1", "64.50")])
        self.assertEqual(same.conflicts, ())

    def test_compression_fits_budget(self):
        agg = aggregate([finding(i, 1, f"q{i}", "x" * 50) for i in range(10)])
        self.assertLessEqual(len(compress_findings(agg, 120)), len(agg.findings_text()))


class EventBusTest(unittest.TestCase):
    def test_once_handlers_failures_and_wildcard(self):
        seen = []
        bus = EventBus()
        bus.on("x", lambda e, **p: seen.append(("once", p["n"])), once=True)
        bus.on("x", lambda e, **p: 1 / 0)
        bus.on("*", lambda e, **p: seen.append(("all", e)))

        async def scenario():
            await bus.emit("x", n=1)
            await bus.emit("x", n=2)

        with self.assertLogs("research.events", "ERROR"):
            asyncio.run(scenario())
        self.assertEqual(seen, [("once", 1), ("all", "x"), ("all", "x")])
        self.assertEqual(bus.errors, 2)

    def test_handler_may_unsubscribe_others_during_emit(self):
        bus = EventBus()
        calls = []
        second = None

        def first(event, **_):
            calls.append("first")
            bus.off(second)

        bus.on("e", first)
        second = bus.on("e", lambda e, **_: calls.append("second"))
        asyncio.run(bus.emit("e"))
        asyncio.run(bus.emit("e"))
        self.assertEqual(calls, ["first", "second", "first"])


class ContextTest(unittest.TestCase):
    def messages(self, steps, size):
        out = [{"role": "system", "content": "system prompt"}, {"role": "user", "content": "task"}]
        for i in range(steps):
            out.append({"role": "assistant", "content": None, "tool_calls": [
                {"id": f"c{i}", "type": "function",
                 "function": {"name": "read_file", "arguments": "{}"}}]})
            out.append({"role": "tool", "tool_call_id": f"c{i}", "content": "word " * size})
        return out

    def test_fits_without_change(self):
        msgs = self.messages(2, 10)
        fitted, report = fit_messages(msgs, 8192, 500)
        self.assertIs(fitted, msgs)
        self.assertFalse(report.changed)

    def test_drops_whole_oldest_exchanges_and_keeps_head(self):
        msgs = self.messages(12, 700)
        fitted, report = fit_messages(msgs, 8192, 700)
        self.assertEqual(fitted[0]["content"], "system prompt")
        self.assertEqual(fitted[1]["content"], "task")
        self.assertIn("context note", fitted[2]["content"])
        self.assertEqual(fitted[3]["role"], "assistant")
        self.assertEqual(fitted[-1]["tool_call_id"], "c11")
        self.assertGreater(report.dropped_messages, 0)
        self.assertLessEqual(report.tokens_after, 8192 - 700)
        self.assertEqual(sum(count_message(m) for m in fitted) + 3, report.tokens_after)
        self.assertEqual(len(msgs[-1]["content"]), 3500)  # the caller's history is untouched

    def test_clips_a_single_huge_result_or_gives_up(self):
        fitted, report = fit_messages(self.messages(1, 9000), 8192, 700)
        self.assertEqual(report.clipped_messages, 1)
        with self.assertRaises(ContextOverflow):
            fit_messages([{"role": "system", "content": "w " * 9000}], 8192, 700)


class TracingTest(unittest.TestCase):
    def test_order_locations_and_crash_flush(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "t.jsonl"
            tracer = Tracer(path)

            async def child(i):
                await asyncio.sleep(0.01 * (3 - i))  # finish in reverse order
                with agent_scope(f"worker-{i}", 1), tracer.span("child", "chain"):
                    pass

            async def scenario():
                with tracer.span("root", "agent") as root:
                    spans = [tracer.span("slot", "chain") for _ in range(3)]
                    await asyncio.gather(*(self._use(s, child(i)) for i, s in enumerate(spans)))
                    tracer.span("left-open", "other")
                    return root

            asyncio.run(scenario())
            tracer.flush()
            lines = [json.loads(l) for l in path.read_text().splitlines()]
            names = [(l["name"], l["attributes"]["gen_ai.agent.name"]) for l in lines]
            self.assertEqual(names[0], ("root", "research"))
            self.assertEqual([n for n in names if n[0] == "child"],
                             [("child", "worker-0"), ("child", "worker-1"), ("child", "worker-2")])
            ids = {l["span_id"]: l for l in lines}
            for line in lines[1:]:
                self.assertIn(line["parent_span_id"], ids)
                self.assertEqual(line["attributes"]["code.filepath"], "tests/test_state.py")
            open_span = next(l for l in lines if l["name"] == "left-open")
            self.assertEqual(open_span["status"]["code"], "ERROR")

    @staticmethod
    async def _use(span, coro):
        with span:
            await coro


class RunStatisticsTest(unittest.TestCase):
    def test_statistics_note_the_first_finding_once(self):
        bus = EventBus()
        stats = RunStatistics(bus)

        async def scenario():
            await bus.emit("finding.added", finding=finding(0, 1, "q0", "early"))
            await bus.emit("plan.ready", subquestions=2)
            await bus.emit("finding.added", finding=finding(1, 2, "q1", "first"))
            await bus.emit("finding.added", finding=finding(2, 3, "q2", "later"))

        asyncio.run(scenario())
        self.assertEqual(stats.first_finding_round, 2)
        self.assertEqual(stats.counts["finding.added"], 3)
        self.assertEqual(bus.subscribers("finding.added"), 1, "only the counter is left")
        self.assertEqual(bus.errors, 0)


if __name__ == "__main__":
    unittest.main()
