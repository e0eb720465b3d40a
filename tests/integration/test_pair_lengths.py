"""What data.max_length does to preference rows, counted before load (components/data/pair_lengths.py), is
what TRL's own trainers do with the same rows: DPOTrainer drops the rows whose prompt alone fills the limit
and cuts the others; RewardTrainer drops every pair with a side past the limit."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from hydratune.components.data import PreferenceDataset
from hydratune.components.data.pair_lengths import PairLengths, check_pairs, pair_notes
from hydratune.components.data.rows import scratch_workers
from tests.support.data import TINY, write_jsonl

LIMIT = 128


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, object, dict]:
    """Pairs of every length around the limit: short ones, responses past it, prompts that alone fill it."""
    from transformers import AutoTokenizer

    rng = random.Random(0)
    words = ["the", "a", "river", "town", "grew", "over", "many", "years", "into", "city", "of", "trade"]
    rows = []
    for i in range(60):
        prompt = " ".join(rng.choice(words) for _ in range(rng.choice([3, 8, 20, 40, 60])))
        chosen = " ".join(rng.choice(words) for _ in range(rng.choice([2, 10, 30])))
        rows.append({"prompt": f"{i}: {prompt}", "chosen": chosen, "rejected": f"no {i} " + chosen[::-1]})
    path = write_jsonl(tmp_path_factory.mktemp("pairs") / "pairs.jsonl", rows)
    data = PreferenceDataset(path=path, eval_size=0).load()
    tok = AutoTokenizer.from_pretrained(str(TINY))
    return (
        data,
        tok,
        {o: PairLengths(LIMIT, o).prepare(data, tok, scratch_workers())[1] for o in ("truncate", "drop")},
    )


def tiny_model(task: str) -> object:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification

    config = AutoConfig.from_pretrained(str(TINY), num_labels=1)
    cls = AutoModelForSequenceClassification if task == "seq_cls" else AutoModelForCausalLM
    return cls.from_config(config)


def test_dpo_drops_and_cuts_what_the_counts_say(pairs: tuple, tmp_path: Path) -> None:
    from trl import DPOConfig, DPOTrainer

    data, tok, facts = pairs
    c = facts["truncate"]["pairs"]["train"]
    assert 0 < c["prompt_fills"] < c["over"] < c["rows"] == len(data["train"])  # every case is there
    args = DPOConfig(output_dir=str(tmp_path), max_length=LIMIT, report_to=[], use_cpu=True)
    model, ref = tiny_model("causal"), tiny_model("causal")
    trainer = DPOTrainer(model, ref, args=args, train_dataset=data["train"], processing_class=tok)
    kept = trainer.train_dataset
    assert len(data["train"]) - len(kept) == c["prompt_fills"]  # TRL's silent drop, counted
    lengths = [
        (len(p) + len(a), len(p) + len(b))
        for p, a, b in zip(kept["prompt_ids"], kept["chosen_ids"], kept["rejected_ids"], strict=True)
    ]
    assert sum(max(pair) > LIMIT for pair in lengths) == c["over"] - c["prompt_fills"]
    assert max(max(pair) for pair in lengths) <= c["longest"]
    line = pair_notes(facts["truncate"])[f"length (train, data.max_length={LIMIT})"]
    assert f"{c['over']} truncated" in line and f"{c['prompt_fills']} whose prompt alone fills" in line


def test_the_reward_trainer_drops_what_the_counts_say(pairs: tuple, tmp_path: Path) -> None:
    from trl import RewardConfig, RewardTrainer

    data, tok, facts = pairs
    c = facts["drop"]["pairs"]["train"]
    model = tiny_model("seq_cls")
    model.config.pad_token_id = tok.pad_token_id
    args = RewardConfig(output_dir=str(tmp_path), max_length=LIMIT, report_to=[], use_cpu=True)
    trainer = RewardTrainer(model=model, args=args, train_dataset=data["train"], processing_class=tok)
    assert len(data["train"]) - len(trainer.train_dataset) == c["over"] > 0
    assert "dropped by the trainer" in pair_notes(facts["drop"])[f"length (train, data.max_length={LIMIT})"]


def test_a_split_left_with_nothing_to_train_is_refused(pairs: tuple) -> None:
    from hydratune.components.config.errors import ConfigError

    _, _, facts = pairs
    c = facts["truncate"]["pairs"]["train"]
    check_pairs(facts["truncate"], {"train": c["rows"]})  # some rows left: trains
    every = {**facts["truncate"], "pairs": {"train": {**c, "prompt_fills": c["rows"]}}}
    with pytest.raises(
        ConfigError, match=f"no train row is left to train within data.max_length={LIMIT}"
    ) as err:
        check_pairs(every, {"train": c["rows"]})
    assert err.value.key == "data.max_length"
    dropped = {**facts["drop"], "pairs": {"train": {**c, "over": c["rows"]}}}
    with pytest.raises(ConfigError, match="has a side longer than the limit"):
        check_pairs(dropped, {"train": c["rows"]})
