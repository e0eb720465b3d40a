"""A scripted tool-calling policy for GRPO runs in launched processes (tests/multiproc), where a test cannot
monkeypatch: naming this module's tool (``recipe.tools=[tests.support.scripted_agent.add]``) imports it in
the launcher and in every worker, and importing it replaces TRL's ``GRPOTrainer._generate_single_turn`` (the
policy's sampling) with :func:`script` in that process. Test use only: nothing imports it in-process.

The script, for 'What is X + Y?', by the prompt's k-th copy in the generation call (a group's copies are
consecutive and on one rank, in every layout): k even calls add(X, Y) and then answers the tool's result
(right: reward 1), k odd answers 0 at once (wrong): every group has both, so the advantages are not 0.
"""

from __future__ import annotations

import re
from collections import Counter

from trl import GRPOTrainer


def add(a: int, b: int) -> str:
    """Add two whole numbers.

    Args:
        a: the first number
        b: the second number
    """
    return str(a + b)


def script(text: str, copy: int) -> str:
    results = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", text, re.S)
    if results:
        return f"{results[-1]}<|im_end|>"
    if copy % 2:
        return "0<|im_end|>"
    x, y = map(int, re.findall(r"What is (\d+) \+ (\d+)\?", text)[-1])
    return f'<tool_call>\n{{"name": "add", "arguments": {{"a": {x}, "b": {y}}}}}\n</tool_call><|im_end|>'


def scripted(self, prompt_ids, images, fields, num_generations, has_tool_images=False):
    texts = [self._tokenizer.decode(ids) for ids in prompt_ids]
    seen: Counter[str] = Counter()
    replies = []
    for text in texts:
        replies.append(script(text, seen[text]))
        seen[text] += 1
    return [self._tokenizer.encode(r, add_special_tokens=False) for r in replies], None


GRPOTrainer._generate_single_turn = scripted
