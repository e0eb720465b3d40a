"""Data shapes trained end to end on the tiny model: chat templates with and without generation markers
(assistant-only mask), packing, completion-only loss, UltraFeedback and HH preference files, a 70/30 mixture,
tool calls. The tokens that carry loss are decoded and checked, not the summary's words."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from hydratune.components.text.chat_template import CHATML, HYDRATUNE, TRL_MARKERS
from tests.support.data import write_jsonl
from tests.unit.test_chat_template import SMOLLM2_TEMPLATE, STEPS, TINY
from tests.unit.test_columns import write
from tests.unit.test_data_formats import DEFAULT, QUESTION, hh_row, ultrafeedback_row
from tests.unit.test_data_mixture import alpaca, chats
from tests.unit.test_tool_calling import tool_chat


def expected_trained(tok: Any, ids: list[int]) -> str:
    """From the decoded row itself: each assistant content and its <|im_end|>, in order."""
    text = tok.decode(ids)
    return "".join(
        m + "<|im_end|>" for m in re.findall(r"<\|im_start\|>assistant\n(.*?)<\|im_end\|>", text, re.S)
    )


def assert_assistant_only(ctx: Any, rows: int = 16) -> None:
    tok = ctx.trainer.processing_class
    dataset = ctx.trainer.train_dataset
    for row in dataset.select(range(min(rows, len(dataset)))):
        kept = [
            t if label != -100 else None for t, label in zip(row["input_ids"], row["labels"], strict=True)
        ]
        trained = tok.decode([t for t in kept if t is not None])
        assert trained and trained == expected_trained(tok, row["input_ids"])


def test_sft_with_a_template_without_markers_uses_hydratunes_mask(run_recipe, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    template = tmp_path / "smollm2.jinja"
    template.write_text(SMOLLM2_TEMPLATE)
    ctx, _ = run_recipe(*STEPS, f"model.chat_template={template}", name="smollm2_template")
    assert ctx.trainer.args.assistant_only_loss is False  # TRL only folds hydratune's masks into labels
    assert_assistant_only(ctx)
    summary = (ctx.run_dir.path / "summary.md").read_text()
    assert f"| method | {HYDRATUNE} |" in summary
    assert "## loss mask: first training example" in summary
    table = summary.split("## loss mask: first training example")[1].split("\n## ")[0]
    assert "| # | trained | tokens | text |" in table
    # markdown-escaped pipes; the untrained header ends the first segment, the answer + <|im_end|> is trained
    assert re.search(r"\| 1 \| no \| \d+ \| `<\\\|im_start\\\|>system\\nYou are a", table), table
    assert re.search(
        r"<\\\|im_start\\\|>assistant\\n` \|\n\| 2 \| yes \| \d+ \| `\d+<\\\|im_end\\\|>` \|", table
    )
    assert re.search(r"\| 3 \| no \| 1 \| `\\n` \|", table), table
    # final/ keeps the template it was trained with
    assert AutoTokenizer.from_pretrained(str(ctx.run_dir.final)).chat_template == SMOLLM2_TEMPLATE


def test_packed_sft_with_the_default_template(run_recipe, tmp_path: Path) -> None:
    """A tokenizer without a chat template gets ChatML (its tokens are in the vocabulary), masked here,
    and packing keeps the masks."""
    import shutil

    from transformers import AutoTokenizer

    base = tmp_path / "base"
    shutil.copytree(TINY, base, ignore=shutil.ignore_patterns("chat_template.jinja"))
    ctx, _ = run_recipe(  # a copy of the tiny dir: random init, asked for (a dir of yours without weights)
        *STEPS, f"model.name_or_path={base}", "model.init=random", "data.packing=true", name="packed_default"
    )
    assert "seq_lengths" in ctx.trainer.train_dataset.column_names  # packed rows
    assert_assistant_only(ctx, rows=4)
    summary = (ctx.run_dir.path / "summary.md").read_text()
    assert "| chat template | chatml (default: the tokenizer has none) |" in summary
    assert f"| method | {HYDRATUNE} |" in summary
    assert AutoTokenizer.from_pretrained(str(ctx.run_dir.final)).chat_template == CHATML


def test_bundled_template_keeps_trls_path(run_recipe) -> None:
    ctx, _ = run_recipe(*STEPS, name="markers")
    # TRL's masks, made by hydratune as TRL makes them (tests/unit/test_sft_tokens.py), handed over as tokens
    assert ctx.trainer.args.dataset_kwargs == {"skip_prepare_dataset": True}
    assert_assistant_only(ctx)
    assert (
        f"| method | {TRL_MARKERS.replace('|', chr(92) + '|')} |"
        in (ctx.run_dir.path / "summary.md").read_text()
    )


def test_completion_only_loss_without_assistant_only_loss_masks_the_prompt(
    run_recipe, tmp_path: Path
) -> None:
    """recipe.completion_only_loss did nothing: with recipe.assistant_only_loss=false, prompt/completion rows
    trained the prompt (trained fraction 1.0). One short run; its summary also lists the columns."""
    rows = [{"id": i, "prompt": f"What is {i} + 1?", "completion": str(i + 1)} for i in range(12)]
    path = write(tmp_path / "pc.jsonl", rows)
    ctx, _ = run_recipe(
        "data=jsonl_messages", f"data.path={path}", "recipe.assistant_only_loss=false", "train.max_steps=1"
    )
    summary = (ctx.run_dir.path / "summary.md").read_text()
    assert "| rows_fully_trained | 0 |" in summary
    fraction = float(summary.split("| trained_token_fraction | ")[1].split(" ")[0])
    assert 0 < fraction < 0.5
    assert "| columns used | prompt, completion |" in summary and "| columns ignored | id |" in summary


def test_eval_renders_the_whole_conversation_system_prompt_included(run_recipe, tmp_path: Path) -> None:
    """recipe=eval kept the system prompt in 0 of 30 prompts (lm-eval rendered the last turn alone)."""
    system = {"role": "system", "content": "Answer with digits only."}
    history = [{"role": "user", "content": "What is 1 + 1?"}, {"role": "assistant", "content": "2"}]
    rows = [
        {"prompt": [system, *history, {"role": "user", "content": f"And {i} + 1?"}], "answer": str(i + 1)}
        for i in range(4)
    ]
    path = write(tmp_path / "sys.jsonl", rows)
    ctx, _ = run_recipe("recipe=eval", "data=demo_eval", f"data.path={path}", name="eval")
    samples = [json.loads(line) for line in (ctx.run_dir.path / "lm_eval_samples.jsonl").open()]
    prompts = [s["arguments"][0][0] for s in samples]
    assert len(prompts) == 4
    for i, prompt in enumerate(sorted(prompts, key=lambda p: p[-40:])):
        at = [prompt.index(text) for text in ("Answer with digits only.", "What is 1 + 1?", f"And {i} + 1?")]
        assert at == sorted(at), prompt
    summary = (ctx.run_dir.path / "summary.md").read_text()
    assert "| columns used | prompt, answer |" in summary


def test_dpo_and_reward_train_on_ultrafeedback_and_hh_files(run_recipe, tmp_path: Path) -> None:
    """Short runs: TRL's trainers accept the split rows, the tokenized pairs hold the question once, and
    the summary says which format was read and where the eval rows came from."""
    fast = ["train.micro_batch_size=4", "train.max_steps=2", "train.eval_generations=0", "train.save_every=0"]
    uf = write_jsonl(tmp_path / "ultrafeedback.jsonl", [ultrafeedback_row(i) for i in range(40)])
    ctx, _ = run_recipe("recipe=dpo", f"data.path={uf}", *fast, name="dpo_uf")
    first = ctx.trainer.train_dataset[0]
    text = ctx.trainer.processing_class.decode(first["prompt_ids"] + first["chosen_ids"])
    assert text.count(QUESTION) == 1 and "Simmer it" in text, text
    result = json.loads((ctx.run_dir.path / "result.json").read_text())["data"]
    assert result["format"] == "implicit (detected)"
    assert result["eval rows from"] == f"5% of data.path, at most 1,000 rows (seed 42; {DEFAULT}"
    assert result["eval rows"] == 2
    hh = write_jsonl(tmp_path / "hh.jsonl", [hh_row(i) for i in range(40)])
    ctx, _ = run_recipe("recipe=reward", f"data.path={hh}", *fast, name="rm_hh")
    result = json.loads((ctx.run_dir.path / "result.json").read_text())["data"]
    assert result["format"] == "hh (detected)" and result["train rows"] == 38
    assert (ctx.run_dir.final / "model.safetensors").is_file()


def test_a_70_30_mixture_trains_and_the_summary_gives_rows_per_source(run_recipe, tmp_path: Path) -> None:
    a, b = alpaca(tmp_path, 30), chats(tmp_path, 30)
    mixture = f"data.mixture=[{{path: {a}, weight: 0.7}},{{path: {b}, weight: 0.3}}]"
    ctx, metrics = run_recipe(
        "data=jsonl_messages", mixture, "data.eval_size=2", "train.max_steps=2", "train.micro_batch_size=4"
    )
    summary = (ctx.run_dir.path / "summary.md").read_text()
    assert f"data.mixture[0] {a}" in summary and "20 of 28 train rows (weight 0.7)" in summary
    assert f"data.mixture[1] {b}" in summary and "8 of 28 train rows (weight 0.3)" in summary
    assert "eval_loss" in metrics


# ---- end to end -----------------------------------------------------------------------------------------
def test_sft_on_tool_data_trains_the_tool_call_not_the_result(run_recipe: Any, tmp_path: Path) -> None:
    """The acceptance run on the tiny model (the GGUF SmolLM2 run is the same with model=smollm2_135m): TRL's
    qwen2_5 template, the summary's first-example table shows the <tool_call> trained, the result not."""
    path = write_jsonl(
        tmp_path / "tools.jsonl",
        [tool_chat(city, f"{t} degrees") for t, city in enumerate(["Paris", "Rome", "Oslo", "Lima"] * 3)],
    )
    ctx, _ = run_recipe(
        "data=jsonl_messages",
        f"data.path={path}",
        "model.chat_template=qwen2_5",
        "train.max_steps=1",
        "train.eval_generations=0",
    )
    summary = (ctx.run_dir.path / "summary.md").read_text()
    table = summary.split("## loss mask: first training example")[1].split("\n## ")[0]
    rows = [line.split(" | ") for line in table.splitlines() if line.startswith("| ") and "<" in line]
    trained = " ".join(r[3] for r in rows if r[1] == "yes")
    untrained = " ".join(r[3] for r in rows if r[1] == "no")
    assert "<tool_call>" in trained and "get_weather" in trained
    assert "<tool_response>" in untrained and "degrees\\n</tool_response>" in untrained
    assert "tool_response" not in trained
