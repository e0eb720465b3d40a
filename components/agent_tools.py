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


class GuessingGame:
    """A stateful environment (``recipe.environment``): the row's secret number (its ``answer`` column), which
    the model finds by calling ``guess``; the game answers higher / lower / correct and keeps count. The
    reward is 1 once the number is found, else 0 (``data=demo_agent``, docs/agents.md)."""

    def reset(self, answer: str, **row: object) -> None:
        self.secret, self.found, self.guesses = int(answer), False, 0

    def guess(self, number: int) -> str:
        """Guess the secret number.

        Args:
            number: your guess
        """
        self.guesses += 1
        if number == self.secret:
            self.found = True
            return "correct"
        return "higher" if number < self.secret else "lower"

    def get_reward(self) -> float:
        return 1.0 if self.found else 0.0
