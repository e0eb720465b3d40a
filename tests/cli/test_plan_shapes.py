"""Plan and training agree on the data shapes of issue 34 item 5: the same bad file is refused by both,
exit 2, with the same error, before any model loads (no run trains, no traceback)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.data import write_jsonl


def pairs(tmp_path: Path) -> list[str]:
    """DPO on explicit pairs, one of them identical (trained before issue 34)."""
    rows = [{"prompt": f"{i}+1?", "chosen": str(i + 1), "rejected": str(i + 2)} for i in range(12)]
    rows[5]["rejected"] = rows[5]["chosen"]
    return ["recipe=dpo", f"data.path={write_jsonl(tmp_path / 'pairs.jsonl', rows)}"]


def factory(tmp_path: Path) -> list[str]:
    """A LLaMA-Factory dir whose sharegpt row has its roles out of order."""
    root = tmp_path / "lf"
    root.mkdir()
    good = {"conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": "b"}]}
    bad = {"conversations": [{"from": "gpt", "value": "b"}, {"from": "human", "value": "a"}]}
    write_jsonl(root / "chats.jsonl", [good] * 6 + [bad] + [good] * 3)
    (root / "dataset_info.json").write_text(
        json.dumps({"chats": {"file_name": "chats.jsonl", "formatting": "sharegpt"}})
    )
    return [f"data.path={root}"]


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (pairs, "1 of 12 pairs has the same 'chosen' and 'rejected' response"),
        (factory, "chats.jsonl:7 (row 7): message 0 in column 'conversations' has role 'gpt'"),
    ],
)
def test_plan_and_training_refuse_the_same_bad_shape_before_load(
    hydratune, tmp_path: Path, make, words
) -> None:
    args = make(tmp_path)
    plan = hydratune("mode=plan", *args, cwd=tmp_path)
    train = hydratune("train.max_steps=1", *args, cwd=tmp_path)
    for proc in (plan, train):
        assert proc.returncode == 2, proc.stderr[-800:]
        assert words in proc.stderr and "Traceback" not in proc.stderr
        assert "checks passed" not in proc.stdout
    error = [line for line in plan.stderr.splitlines() if "error:" in line]
    assert error and error == [line for line in train.stderr.splitlines() if "error:" in line]
    assert not list(tmp_path.glob("outputs/*/*/final"))  # nothing trained


def test_identical_pairs_skipped_are_counted_and_the_cached_rows_reopen(hydratune, tmp_path: Path) -> None:
    """``data.on_error=skip``: the identical pair dropped and counted; the prepared rows (a selection, then
    the eval split's selection of it) reopen from the data cache (its indices were saved as uint64)."""
    args = [*pairs(tmp_path), "data.on_error=skip", f"data.cache_dir={tmp_path / 'cache'}"]
    for _ in range(2):  # prepared, then reused
        plan = hydratune("mode=plan", *args, cwd=tmp_path)
        assert plan.returncode == 0, plan.stderr[-800:]
        assert "# data: dropped (identical chosen/rejected): 1" in plan.stdout
        assert "# data: train rows: 10" in plan.stdout and "# data: eval rows: 1" in plan.stdout
    assert "data cache: hit" in plan.stdout
