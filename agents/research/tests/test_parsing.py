import unittest

from research.jsonextract import JSONExtractError, extract_json
from research.prompts import TemplateError, few_shot, render, system_prompt
from research.tokens import count_prompt, count_text
from research.writer import AnswerMissing, extract_answer


class JSONExtractTest(unittest.TestCase):
    def test_shapes(self):
        self.assertEqual(extract_json('{"a": 1}'), {"a": 1})
        self.assertEqual(extract_json('```json\n{"a": "}"}\n```'), {"a": "}"})
        self.assertEqual(extract_json('```\n{"b": 2}\n```'), {"b": 2})
        self.assertEqual(extract_json('Plan:\n{"x": {"y": [1, "{"]}} done'), {"x": {"y": [1, "{"]}})
        self.assertEqual(extract_json('```python\nx = {}\n```\n```json\n{"c": 3}\n```'), {"c": 3})

    def test_failures_say_why(self):
        for bad in [None, "", "no json here", "```json\n{broken\n```"]:
            with self.assertRaises(JSONExtractError):
                extract_json(bad)


class PromptTest(unittest.TestCase):
    def test_render_is_single_pass_and_strict(self):
        self.assertEqual(render("a {{x}} b", x="{{y}} {z}"), "a {{y}} {z} b")
        with self.assertRaises(TemplateError):
            render("{{x}} {{y}}", x=1)
        with self.assertRaises(TemplateError):
            render("{{x}}", x=1, y=2)

    def test_system_prompts_render_with_examples(self):
        text = system_prompt("planner", max_sections=3, max_questions=3)
        self.assertIn(few_shot("planner"), text)
        self.assertNotIn("{{", text)
        self.assertIn('"verdict"', system_prompt("reflect"))
        self.assertIn("researcher 4", system_prompt("researcher", index=4))


class TokenTest(unittest.TestCase):
    def test_matches_the_api_rule(self):
        cases = {"": 0, "cat": 1, "catsz": 2, "hello, world!": 6, '{"a":1}': 7,
                 "Zürich": 2, "日本語です": 2, "snake_case_name": 4, "  \n\t": 0}
        for text, expected in cases.items():
            self.assertEqual(count_text(text), expected, text)

    def test_prompt_framing(self):
        self.assertEqual(count_prompt([{"role": "user", "content": "hi"}]), 3 + 3 + 1 + 1)


class AnswerTest(unittest.TestCase):
    def test_last_final_answer_line(self):
        self.assertEqual(extract_answer("x\nFinal answer: 12\nmore\n**Final Answer:** 1871."), "1871")
        self.assertEqual(extract_answer("Final answer: Marta Quell"), "Marta Quell")
        self.assertEqual(extract_answer("Final answer: 40.7"), "40.7")
        with self.assertRaises(AnswerMissing):
            extract_answer("The answer is 3")


if __name__ == "__main__":
    unittest.main()
