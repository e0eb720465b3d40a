"""More data shapes (issue 34, item 5): identical preference pairs in every format, ``.txt`` corpora,
LLaMA-Factory dataset dirs; each checked on the rows a load gives (what the trainer reads)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from components.config.errors import ConfigError
from components.data import PreferenceDataset
from tests.support.data import write_jsonl


def refused(fn: Any) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        fn()
    return info.value


# ------------------------------------------------------------------------------ identical pairs


def turns(question: str, answer: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]


def pair_rows(fmt: str, i: int, same: bool) -> dict[str, Any]:
    """Row ``i`` of a preference file in format ``fmt``; ``same``: chosen and rejected identical."""
    good, bad = f"good {i}", f"good {i}" if same else f"bad {i}"
    if fmt == "explicit":
        return {"prompt": f"q{i}", "chosen": good, "rejected": bad}
    if fmt == "implicit":
        return {"chosen": turns(f"q{i}", good), "rejected": turns(f"q{i}", bad)}
    return {
        "chosen": f"\n\nHuman: q{i}\n\nAssistant: {good}",
        "rejected": f"\n\nHuman: q{i}\n\nAssistant: {bad}",
    }


SAME = (3, 7)  # the rows whose chosen and rejected are identical


@pytest.mark.parametrize("fmt", ["explicit", "implicit", "hh"])
def test_identical_pairs_are_refused_or_dropped_and_counted_in_every_format(tmp_path: Path, fmt: str) -> None:
    """A pair with nothing to prefer is refused naming how many and the first (file:line), in every format;
    ``data.on_error=skip`` drops exactly those rows and counts them: no trained pair is identical."""
    path = write_jsonl(tmp_path / f"{fmt}.jsonl", [pair_rows(fmt, i, i in SAME) for i in range(12)])
    err = refused(lambda: PreferenceDataset(path=path, eval_fraction=0.0).load())
    assert err.key == "data.path"
    assert "2 of 12 pairs have the same 'chosen' and 'rejected'" in str(err)
    assert f"{fmt}.jsonl:{SAME[0] + 1} (row {SAME[0] + 1})" in str(err)
    assert "data.on_error=skip" in (err.hint or "")

    data = PreferenceDataset(path=path, eval_fraction=0.0, on_error="skip").load()
    train = data["train"]
    assert len(train) == 12 - len(SAME)
    assert data.stats["dropped (identical chosen/rejected)"] == len(SAME)
    assert all(c != r for c, r in zip(train["chosen"], train["rejected"], strict=True))
    kept = [m[-1]["content"] for m in train["chosen"]]
    assert kept == [f"good {i}" for i in range(12) if i not in SAME]
