"""One SFT run on the shapes issue 34 found trained wrongly with exit 0: a model export dir on top of the
default model, OpenAI-format turns with ``"weight": 0``, assistant ``reasoning_content`` under the qwen3
template, and a message key nothing reads. What the trainer trains is decoded from its own dataset."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.support.data import tiny_export, write_jsonl
from tests.unit.test_chat_template import STEPS

IGNORE = -100


def row(i: int) -> dict[str, Any]:
    return {
        "messages": [
            {"role": "user", "content": f"hi {i}", "name": "bob"},
            {"role": "assistant", "content": f"BADTURN {i}", "weight": 0},
            {"role": "user", "content": "again"},
            {"role": "assistant", "content": f"GOOD {i}", "weight": 1, "reasoning_content": f"THINK {i}"},
        ]
    }


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory) -> Path:
    return tiny_export(tmp_path_factory.mktemp("export"), seed=11)


def test_the_run_trains_what_the_file_means(run_recipe, tmp_path: Path, export_dir: Path) -> None:
    path = write_jsonl(tmp_path / "chats.jsonl", [row(i) for i in range(24)])
    ctx, _ = run_recipe(
        *STEPS,
        f"data.path={path}",
        f"model.name_or_path={export_dir}",
        "model.chat_template=qwen3",
        name="silent",
    )
    assert ctx.components.model.init == "pretrained"
    tok = ctx.trainer.processing_class
    for example in ctx.trainer.train_dataset:
        ids, labels = example["input_ids"], example["labels"]
        trained = tok.decode([t for t, label in zip(ids, labels, strict=True) if label != IGNORE])
        whole = tok.decode(ids)
        i = re.search(r"hi (\d+)", whole).group(1)
        assert f"BADTURN {i}" in whole and "BADTURN" not in trained, trained  # context, not trained
        assert f"<think>\nTHINK {i}\n</think>\n\nGOOD {i}<|im_end|>" in trained, trained
    summary = (ctx.run_dir.path / "summary.md").read_text()
    assert f"| model weights | loaded from {export_dir} (model.safetensors)" in summary
    assert "| message keys ignored | name (" in summary
    table = summary.split("## loss mask: first training example")[1].split("\n## ")[0]
    assert re.search(r"\| no \| \d+ \| `[^`]*BADTURN \d+", table), table
    assert re.search(r"\| yes \| \d+ \| `<think>\\nTHINK \d+\\n</think>\\n\\nGOOD \d+", table), table
