"""The calculator tool: arithmetic over a parsed syntax tree, never `eval`.

Grammar and result formatting follow agents/tasks/README.md so every agent prints the same
number for the same expression.
"""

from __future__ import annotations

import ast
import math
import operator

from research.tools.corpus import ToolError

MAX_EXPRESSION_CHARS = 500
MAX_EXPONENT = 1000

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def _round(x: float, n: float | None = None) -> float:
    if n is None:
        return round(x)
    if n != int(n):
        raise ToolError("round() takes a whole number of digits")
    return round(x, int(n))


def _sqrt(x: float) -> float:
    if x < 0:
        raise ToolError("sqrt of a negative number")
    return math.sqrt(x)


def _variadic(fn):
    def call(*args):
        if not args:
            raise ToolError(f"{fn.__name__}() needs at least one argument")
        return fn(args)

    return call


_FUNCTIONS = {
    "round": (_round, 1, 2),
    "abs": (abs, 1, 1),
    "sqrt": (_sqrt, 1, 1),
    "min": (_variadic(min), 1, None),
    "max": (_variadic(max), 1, None),
    "sum": (_variadic(sum), 1, None),
}


def evaluate(expression: str) -> int | float:
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ToolError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise ToolError(f"cannot parse expression at column {exc.offset}: {exc.msg}") from None
    try:
        return _eval(tree.body)
    except ZeroDivisionError:
        raise ToolError("division by zero") from None
    except OverflowError:
        raise ToolError("numeric overflow") from None


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ToolError(f"exponent larger than {MAX_EXPONENT}")
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
        spec = _FUNCTIONS.get(node.func.id)
        if spec is None:
            raise ToolError(f"unknown function {node.func.id!r}")
        fn, lo, hi = spec
        if len(node.args) < lo or (hi is not None and len(node.args) > hi):
            raise ToolError(f"{node.func.id}() takes {lo}" + (f"–{hi}" if hi != lo else "")
                            + f" arguments, got {len(node.args)}")
        return fn(*[_eval(arg) for arg in node.args])
    raise ToolError(f"unsupported syntax: {ast.unparse(node)!r}")


def format_number(value: int | float) -> str:
    """Integral results below 1e15 as integers; everything else as `.12g`."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ToolError("result is not a finite number")
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return format(value, ".12g")


def calculate(expression: str) -> str:
    return format_number(evaluate(expression))
