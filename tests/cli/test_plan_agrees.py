"""``mode=plan``'s "checks passed" means training gets past data preparation: plan and training run on the
same bad files and agree (both exit 2 with the same error, before any model loads, no run dir left)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.data import write_jsonl


def turns(*pairs: tuple[str, str], **extra: dict[str, Any]) -> dict[str, Any]:
    return {
        "messages": [{"role": r, "content": c, **extra.get(str(i), {})} for i, (r, c) in enumerate(pairs)]
    }


SYSTEM = "Rules: always be polite and precise. " * 40
LONG = "it grew from a small trading post into a large city over many centuries, " * 4
BAD = {
    # the system prompt alone is past max_length: no row keeps a token to train (TRL's StopIteration before)
    "system past the limit": (
        [turns(("system", SYSTEM), ("user", f"capital {i}?"), ("assistant", "Nairobi.")) for i in range(12)],
        ["data.max_length=128"],
        "[data.max_length] no train row is left to train within data.max_length=128",
    ),
    # answers cut before their end: the stop token is never trained (refused only after load before)
    "answers cut": (
        [
            turns(("user", f"capital {i}?"), ("assistant", f"Sorry, the capital {i} is a long story: {LONG}"))
            for i in range(12)
        ],
        ["data.max_length=64", "data.min_trained_fraction=0"],
        "[data.max_length] only 0% of train rows train the end-of-sequence token",
    ),
    # a template whose end-of-turn token the tokenizer lacks (refused only after load before)
    "gemma template": (
        [turns(("user", f"capital {i}?"), ("assistant", f"city {i}")) for i in range(12)],
        ["model.chat_template=gemma"],
        "[model.chat_template] only 0% of rows train the end-of-sequence token",
    ),
    "reasoning the template drops": (
        [
            turns(("user", f"{i}+1?"), ("assistant", str(i + 1)), **{"1": {"reasoning_content": "THINK"}})
            for i in range(12)
        ],
        [],
        "[model.chat_template] train row 0: the chat template",
    ),
    # preference rows whose prompt alone fills max_length: TRL's DPOTrainer drops every one (an empty
    # dataset after the load before)
    "pairs whose prompt fills the limit": (
        [{"prompt": f"{i}: {LONG}", "chosen": f"yes {i}", "rejected": f"no {i}"} for i in range(12)],
        ["recipe=dpo", "data.max_length=32"],
        "[data.max_length] no train row is left to train within data.max_length=32",
    ),
    "every turn flagged off": (
        [turns(("user", f"{i}+1?"), ("assistant", str(i + 1)), **{"1": {"weight": 0}}) for i in range(12)],
        [],
        "[data.path] no train row has a token to train",
    ),
}


@pytest.mark.parametrize("case", BAD)
def test_plan_and_training_refuse_the_same_files_alike(hydratune, tmp_path: Path, case: str) -> None:
    rows, overrides, first = BAD[case]
    path = write_jsonl(tmp_path / "rows.jsonl", rows)
    args = (f"data.path={path}", *overrides, "train.max_steps=2", "train.eval_generations=0")
    plan = hydratune("mode=plan", *args, cwd=tmp_path)
    train = hydratune(*args, cwd=tmp_path)
    errors = []
    for done in (plan, train):
        assert done.returncode == 2, done.stderr[-2000:]
        assert "Traceback" not in done.stderr and "checks passed" not in done.stdout
        errors.append(next(line for line in done.stderr.splitlines() if line.startswith("hydratune: error:")))
    assert errors[0] == errors[1] and first in errors[0], errors
    assert not [p for p in tmp_path.glob("outputs/*/*") if p.is_dir()]  # neither left a run dir
