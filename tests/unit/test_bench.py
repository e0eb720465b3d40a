"""The throughput harness (bench/throughput.py) in its CPU mode, so it never rots: the data generator's
length distribution, the table, and one tiny end-to-end run of hydratune, TRL and the raw loop."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import data as bench_data  # noqa: E402 - bench/ goes on the path first
import throughput  # noqa: E402


@pytest.mark.parametrize(
    ("lengths", "n"), [(bench_data.CPU_LENGTHS, 2000), (bench_data.GPU_LENGTHS, 4000)], ids=["cpu", "gpu"]
)
def test_lengths_are_long_tailed_with_the_requested_median_and_max(lengths, n):
    drawn = bench_data.sample_lengths(n, **lengths)
    assert drawn == bench_data.sample_lengths(n, **lengths)  # deterministic
    assert drawn != bench_data.sample_lengths(n, **lengths, seed=1)
    assert abs(statistics.median(drawn) - lengths["median"]) <= 0.1 * lengths["median"]
    assert max(drawn) == lengths["max_len"] and min(drawn) >= lengths["min_len"]
    assert statistics.fmean(drawn) > 1.2 * statistics.median(drawn)  # a long right tail


def test_generated_rows_have_exactly_the_drawn_token_counts(tmp_path):
    path, tokens, drawn = bench_data.make("variable", tmp_path, 60, 128, bench_data.CPU_LENGTHS)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    ids = [json.loads(line)["input_ids"] for line in tokens.read_text().splitlines()]
    assert [len(i) for i in ids] == drawn
    assert [bench_data.chat_length(r["messages"]) for r in rows] == drawn
    assert (
        path.read_text()
        == bench_data.make("variable", tmp_path / "again", 60, 128, bench_data.CPU_LENGTHS)[0].read_text()
    )
    path, tokens, _ = bench_data.make("packed", tmp_path, 3, 128, bench_data.CPU_LENGTHS)
    tok = bench_data.tokenizer()
    texts = [json.loads(line)["text"] for line in path.read_text().splitlines()]
    assert [len(tok(t, add_special_tokens=False)["input_ids"]) for t in texts] == [127] * 3  # + EOS
    assert [len(json.loads(line)["input_ids"]) for line in tokens.read_text().splitlines()] == [128] * 3


def fake(tps: float, mem: float) -> dict:
    return {"tokens/s": tps, "step time (s)": 0.5, "peak memory (GiB)": mem}


def test_table_has_ratio_columns_and_targets(tmp_path):
    rows = [
        {
            "variant": "sft_full",
            "regime": "packed",
            "hydratune": fake(300, 1.0),
            "trl": fake(200, 2.0),
            "raw": fake(400, 1.5),
        },
        {
            "variant": "zero3",
            "regime": "packed",
            "hydratune": fake(270, 1.0),
            "trl": {"error": "boom\nValueError: x"},
        },
    ]
    throughput.derived(rows, n_params=1000, peak_flops=1e7)
    assert rows[0]["h/trl"] == pytest.approx(1.5) and rows[0]["h/raw"] == pytest.approx(0.75)
    assert rows[0]["hydratune"]["mfu"] == pytest.approx(6 * 1000 * 300 / 1e7)
    assert rows[1]["zero3/sft_full"] == pytest.approx(0.9)
    meta = {
        "command": "python bench/throughput.py --cpu",
        "date": "today",
        "wall": 1.0,
        "device": "CPU",
        "versions": {"torch": "x"},
        "shape": "tiny",
        "params": 1000,
        "seq_len": 128,
        "micro_batch": 4,
        "steps": 3,
        "warmup": 1,
        "peak": {"flops": 1e7, "dtype": "float32", "size": 64},
        "lengths": {},
    }
    table = throughput.render(rows, meta)
    assert "| hydratune÷TRL | hydratune÷raw |" in table
    assert "| sft_full | packed | 300 | 200 | 400 | 1.50 | 0.75 |" in table
    assert ">= 1.30x TRL at <= its memory: met" in table  # 1.5x at half the memory
    assert ">= 0.85x hydratune sft_full/packed: met" in table  # zero3 at 0.9x
    assert "(GPU goal)" in throughput.render(rows, {**meta, "gpu": False})
    assert "trl: ValueError: x" in table
    doc = tmp_path / "b.md"
    doc.write_text("# Benchmarks\n\nintro\n")
    throughput.update_section(doc, "gpu", "GPU TABLE\n")
    throughput.update_section(doc, "cpu", "CPU TABLE\n")
    throughput.update_section(doc, "cpu", "CPU TABLE 2\n")
    text = doc.read_text()
    assert "intro" in text and "GPU TABLE" in text and "CPU TABLE 2" in text and "CPU TABLE\n" not in text


def test_chat_pairs_give_the_raw_loop_the_tokens_the_template_makes(tmp_path):
    """--real's DPO rows are conversational (every trainer applies the chat template): the raw loop's tokens
    are the template's, the prompt with its assistant header and each answer with its end marker."""
    path, tokens, drawn = bench_data.make("chat_pairs", tmp_path, 5, 128, bench_data.CPU_LENGTHS)
    tok = bench_data.tokenizer()
    for record, ids in zip(
        (json.loads(line) for line in path.read_text().splitlines()),
        (json.loads(line) for line in tokens.read_text().splitlines()),
        strict=True,
    ):
        assert record["prompt"][0]["role"] == "user" and record["chosen"][0]["role"] == "assistant"
        head = tok.apply_chat_template(record["prompt"], add_generation_prompt=True, tokenize=True)
        assert ids["prompt"] == bench_data.as_ids(head)
        for key in ("chosen", "rejected"):
            whole = tok.apply_chat_template(record["prompt"] + record[key], tokenize=True)
            assert ids["prompt"] + ids[key] == bench_data.as_ids(whole)
            assert tok.decode(ids[key]).strip().startswith(record[key][0]["content"].strip())
    assert len(drawn) == 5


def test_the_real_table_compares_four_implementations_and_times_grpo_by_the_step():
    """--real: TRL twice (defaults; configured like hydratune) beside hydratune and the raw loop; GRPO counts
    no tokens, so its ratios and spread are by step time (a slower step is a smaller ratio)."""
    grpo = {
        "variant": "grpo_lora",
        "regime": "prompts",
        "repeats": 3,
        "hydratune": {"step time (s)": 1.5, "spread": (1 / 1.6, 1 / 1.4), "first step (s)": 8.0},
        "trl": {"step time (s)": 3.0, "spread": (1 / 3.2, 1 / 2.9), "first step (s)": 10.0},
        "trl_like": {"step time (s)": 2.0, "spread": (0.5, 0.5)},
    }
    sft = {"variant": "sft_lora", "regime": "packed", "repeats": 3}
    sft.update(
        {
            i: {**fake(t, 1.0), "spread": (t - 1, t + 1)}
            for i, t in zip(throughput.REAL_IMPLS, (200, 100, 250, 400), strict=True)
        }
    )
    rows = [sft, grpo]
    throughput.derived(rows, n_params=1000, peak_flops=1e7)
    assert grpo["h/trl"] == pytest.approx(2.0) and grpo["h/trl_like"] == pytest.approx(4 / 3)
    assert sft["h/trl"] == pytest.approx(2.0) and sft["h/trl_like"] == pytest.approx(0.8)
    assert sft["h/raw"] == pytest.approx(0.5)
    meta = {"command": "c", "date": "d", "wall": 1.0, "device": "CPU", "versions": {}, "params": 1e8}
    meta.update({"seq_len": 128, "micro_batch": 4, "steps": 10, "warmup": 2})
    table = throughput.render_real(rows, meta)
    assert "| sft_lora | packed | 200 / 100 / 250 / 400 | 2.00 | 0.80 | 0.50 |" in table
    assert "| grpo_lora | prompts | — / — / — / — | 2.00 | 1.33 | — | 1.50 / 3.00 / 2.00 / — |" in table
    assert "h 1.40-1.60 s/step" in table and "h 199-201 tok/s" in table
