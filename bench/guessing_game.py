"""The guessing-game agent demo read exactly (a bench, not a test; docs/agents.md).

For each run dir (the warm start of ``+experiment=demo_agent_sft`` or a GRPO run of
``+experiment=demo_agent_grpo``), the model's policy is scored, not sampled: at every point of a game (the
prompt, then the guesses so far and the game's answers, rendered by the run's chat template with the
tool's schema) each of the seven well-formed calls ``guess(1)`` .. ``guess(7)`` is scored whole, through
its ``<|im_end|>``, at the sampling temperature; walking the game tree from those probabilities gives the
exact chance that an episode finds each secret within ``--calls`` guesses: what GRPO's sampled reward
estimates, without its noise. Any other turn (a malformed call, an answer without a call, another number)
counts as a lost game, as does a path under ``--prune`` (its probability is left out), so each number is a
lower bound of the sampled reward. With ``metrics.jsonl`` (a GRPO run) it also prints the logged reward,
tool calls per episode and ``frac_reward_zero_std`` per window of steps.

    python bench/guessing_game.py <run dir> [<run dir> ...] [--temperature 0.7] [--calls 3] [--window 5]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
TRANSCRIPTS = REPO / "components" / "assets" / "demo" / "agent_sft.jsonl"
NUMBERS = range(1, 8)


def answer(number: int, secret: int) -> str:
    """The game's reply (components/agent_tools.py GuessingGame.guess)."""
    return "correct" if number == secret else "higher" if number < secret else "lower"


def call(number: int) -> dict:
    function = {"name": "guess", "arguments": {"number": number}}
    return {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": function}]}


class Policy:
    """A run's ``final/`` model: the probability of each guess at a point of the game, cached by history."""

    def __init__(self, run: Path, temperature: float) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        first = json.loads(TRANSCRIPTS.read_text().splitlines()[0])
        self.prompt, self.tools = first["messages"][:1], json.loads(first["tools"])
        self.tokenizer = AutoTokenizer.from_pretrained(run / "final")
        self.model = AutoModelForCausalLM.from_pretrained(run / "final", dtype=torch.float32).eval()
        self.temperature = temperature
        self.cache: dict[tuple, list[float]] = {}

    def render(self, history: tuple, *, then: int | None = None) -> str:
        messages = list(self.prompt)
        for number, reply in history:
            messages += [call(number), {"role": "tool", "name": "guess", "content": reply}]
        if then is None:
            return self.tokenizer.apply_chat_template(
                messages, tools=self.tools, tokenize=False, add_generation_prompt=True
            )
        return self.tokenizer.apply_chat_template([*messages, call(then)], tools=self.tools, tokenize=False)

    @torch.no_grad()
    def guesses(self, history: tuple) -> list[float]:
        """P(guess 1), .., P(guess 7) as the next turn after ``history`` ((guess, reply) pairs)."""
        if history in self.cache:
            return self.cache[history]
        tok, eos = self.tokenizer, self.tokenizer.eos_token
        context = self.render(history)
        head = tok(context, add_special_tokens=False)["input_ids"]
        turns = []
        for number in NUMBERS:
            full = self.render(history, then=number)
            assert full.startswith(context), "the template is not prefix-preserving"
            turn = full[len(context) :]
            turns.append(tok(turn[: turn.index(eos) + len(eos)], add_special_tokens=False)["input_ids"])
        width = len(head) + max(map(len, turns))
        ids = torch.full((len(turns), width), tok.pad_token_id)
        mask = torch.zeros_like(ids)
        for row, turn in enumerate(turns):
            ids[row, : len(head) + len(turn)] = torch.tensor(head + turn)
            mask[row, : len(head) + len(turn)] = 1
        logits = self.model(input_ids=ids, attention_mask=mask).logits.float() / self.temperature
        logp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:, None])[..., 0]
        probs = [
            float(logp[row, len(head) - 1 : len(head) - 1 + len(turn)].sum().exp())
            for row, turn in enumerate(turns)
        ]
        self.cache[history] = probs
        return probs


def finds(
    guesses: Callable[[tuple], list[float]],
    secret: int,
    calls: int,
    prune: float = 0.0,
    history: tuple = (),
    reach: float = 1.0,
) -> float:
    """The chance that a policy (``guesses``: P(guess 1..7) after a history of (guess, reply) pairs) at
    ``history`` finds ``secret`` in ``calls`` more guesses; paths less likely than ``prune`` count as lost."""
    if calls == 0:
        return 0.0
    total = 0.0
    for number, p in zip(NUMBERS, guesses(history), strict=True):
        if number == secret:
            total += p
        elif reach * p >= prune:
            later = (*history, (number, answer(number, secret)))
            total += p * finds(guesses, secret, calls - 1, prune, later, reach * p)
    return total


def shares(probs: list[float]) -> str:
    other = max(0.0, 1 - sum(probs))
    return " ".join(f"{n}:{p:.2f}" for n, p in zip(NUMBERS, probs, strict=True)) + f" other:{other:.2f}"


def windows(run: Path, width: int) -> list[str]:
    """The logged steps' reward, tool calls per episode and frac_reward_zero_std, per ``width`` steps."""
    path = run / "metrics.jsonl"
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    steps = [r for r in rows if "reward" in r and "step" in r]
    out = []
    for start in range(0, len(steps), width):
        part = steps[start : start + width]

        def mean(key: str, part: list[dict] = part) -> float:
            values = [r[key] for r in part if key in r]
            return sum(values) / len(values) if values else float("nan")

        out.append(
            f"  steps {part[0]['step']}-{part[-1]['step']}: reward {mean('reward'):.3f} "
            f"(per step {min(r['reward'] for r in part):.2f}-{max(r['reward'] for r in part):.2f}), "
            f"tool calls/episode {mean('tools/call_frequency'):.2f}, "
            f"frac_reward_zero_std {mean('frac_reward_zero_std'):.2f}"
        )
    evals = [r for r in rows if "eval_reward" in r]
    out += [f"  end-of-run eval: reward {r['eval_reward']:.3f}" for r in evals]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", type=Path, help="run dirs (their final/)")
    p.add_argument("--temperature", type=float, default=0.7, help="the sampling temperature (GRPO's)")
    p.add_argument("--calls", type=int, default=3, help="guesses an episode (recipe.max_tool_calls)")
    p.add_argument("--prune", type=float, default=1e-4, help="paths less likely than this: counted lost")
    p.add_argument("--window", type=int, default=5, help="logged steps per window")
    a = p.parse_args()
    torch.set_num_threads(1)
    for run in a.runs:
        policy = Policy(run, a.temperature)
        found = [finds(policy.guesses, s, a.calls, a.prune) for s in NUMBERS]
        print(f"{run}:")
        print(f"  first guess: {shares(policy.guesses(()))}")
        print(f"  after 4 -> lower: {shares(policy.guesses(((4, 'lower'),)))}")
        print(f"  after 4 -> higher: {shares(policy.guesses(((4, 'higher'),)))}")
        print(
            "  P(found) by secret: " + " ".join(f"{s}:{f:.2f}" for s, f in zip(NUMBERS, found, strict=True))
        )
        print(f"  P(found), the 7 secrets' mean (the exact expected reward): {sum(found) / len(found):.3f}")
        print(f"  game points scored: {len(policy.cache)}")
        for line in windows(run, a.window):
            print(line)


if __name__ == "__main__":
    main()
