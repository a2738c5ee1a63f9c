import unittest

from research.agent import DeepResearchAgent
from research.aggregate import aggregate
from research.findings import Finding
from research.planner import Plan, SubQuestion
from research.reflection import Review


def finding(researcher, round_no, qid, answer, confidence="high"):
    return Finding(researcher, round_no, qid, f"question {qid}", answer, f"evidence {answer}",
                   ("doc.md",), confidence, "ok")


class FollowUpTest(unittest.TestCase):
    def test_a_follow_up_that_re_asks_a_planned_question_keeps_its_id(self):
        planned = SubQuestion("s1q1", "Light", "What is the beam range, in nautical miles?")
        plan = Plan("q", ("Light",), (planned,), "combine")
        review = Review("revise", (), ("what is the  beam range, in nautical miles?",
                                       "When was the lens replaced?"))
        again, new = DeepResearchAgent._re_asked(plan, DeepResearchAgent._follow_ups(plan, review, 2))
        self.assertEqual(again, planned)
        self.assertEqual((new.id, new.section), ("r2q2", "Follow-up"))

    def test_two_rounds_on_one_question_that_disagree_are_a_conflict(self):
        agg = aggregate([finding(0, 1, "s1q1", "22"), finding(1, 2, "s1q1", "18", "low")])
        self.assertEqual([f.answer for f in agg.findings], ["22"])
        self.assertEqual([f.answer for f in agg.conflicts[0].rejected], ["18"])


if __name__ == "__main__":
    unittest.main()
