"""Tools bundled for agent runs and the docs: ``recipe.tools=[hydratune.components.agent_tools.calculator]``.

Plain functions with type hints and a docstring, as every tool must be (components/tools.py): the model is
shown the schema transformers builds from them.
"""

from __future__ import annotations

import ast
import operator

OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression of numbers, + - * / // % and parentheses.

    Args:
        expression: the expression, e.g. "12 * (3 + 4)"
    """
    return format(evaluate(ast.parse(expression, mode="eval").body), "g")


def evaluate(node: ast.AST) -> float:
    """The value of an arithmetic expression's tree; anything else (names, calls, powers) is refused."""
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, (int, float))
        and not isinstance(node.value, bool)
    ):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
        return OPERATORS[type(node.op)](evaluate(node.left), evaluate(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in OPERATORS:
        return OPERATORS[type(node.op)](evaluate(node.operand))
    raise ValueError(f"not arithmetic: {ast.unparse(node)}")
