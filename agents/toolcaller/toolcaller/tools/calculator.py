"""calculator: arithmetic on numbers, evaluated safely from the expression's syntax tree."""

from __future__ import annotations

import ast
import math
import operator
from typing import Any

from .base import Tool, ToolContext, ToolError

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
           ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_FUNCTIONS = {"round": round, "abs": abs, "min": min, "max": max, "sqrt": math.sqrt,
              "floor": math.floor, "ceil": math.ceil, "sum": lambda *xs: sum(xs)}


def evaluate(expression: str) -> float | int:
    try:
        tree = ast.parse(expression.replace("^", "**").replace("×", "*").replace("÷", "/"),
                         mode="eval")
    except SyntaxError as exc:
        raise ToolError(f"cannot parse {expression!r}: {exc.msg}") from exc
    return _eval(tree.body)


def _eval(node: ast.AST) -> float | int:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > 100:
            raise ToolError("exponent too large")
        try:
            return _BINARY[type(node.op)](left, right)
        except ZeroDivisionError as exc:
            raise ToolError("division by zero") from exc
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS and not node.keywords:
        return _FUNCTIONS[node.func.id](*[_eval(a) for a in node.args])
    raise ToolError(f"unsupported expression element: {ast.dump(node)[:60]}")


def format_number(value: float | int) -> str:
    """Integers without a fraction, other values with at most 10 significant decimals."""
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ToolError("the result is not a finite number")
        rounded = round(value, 10)
        if rounded.is_integer():
            return str(int(rounded))
        return repr(rounded)
    return str(value)


class Calculator(Tool):
    name = "calculator"
    description = ("Evaluate an arithmetic expression: + - * / // % ** and parentheses, "
                   "with round, abs, min, max, sum, sqrt, floor, ceil.")
    parameters = {
        "type": "object",
        "properties": {
            "expression": {"anyOf": [{"type": "string"}, {"type": "number"}],
                           "description": "For example '(3120 + 4480) * 1.5'."},
        },
        "required": ["expression"],
        "additionalProperties": False,
    }

    def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        return format_number(evaluate(str(args["expression"])))
