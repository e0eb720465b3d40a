"""Nothing trained that the user did not mean (issue 34): per-turn training flags in the shapes fine-tuning
data carries them, every message key used or named, reasoning kept for the template, truncation counted and
refused before load, and a model dir with weights loaded rather than built at random. The tokens that carry
loss are decoded and checked, not the summary's words."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hydratune.components.config.errors import ConfigError
from hydratune.components.data.chats import ChatDataset
from hydratune.components.data.prepare import check_tokens, length_notes
from hydratune.components.data.readers import RowError
from hydratune.components.data.rows import scratch_workers
from hydratune.components.data.tokens import SFTTokens
from hydratune.components.text.sft_tokens import IGNORE
from tests.support.data import TINY, tiny_export, write_jsonl


def turns(*pairs: tuple[str, str], **extra: dict[str, Any]) -> dict[str, Any]:
    """A conversation of (role, content) turns; ``extra[str(i)]`` adds keys to turn i."""
    return {
        "messages": [{"role": r, "content": c, **extra.get(str(i), {})} for i, (r, c) in enumerate(pairs)]
    }


def two_answers(flag: dict[str, Any], good: dict[str, Any] | None = None, i: int = 0) -> dict[str, Any]:
    """user, BAD answer (``flag``), user, GOOD answer (``good``)."""
    pairs = (
        ("user", f"hi {i}"),
        ("assistant", f"BADTURN {i}"),
        ("user", "again"),
        ("assistant", f"GOOD {i}"),
    )
    return turns(*pairs, **{"1": flag, "3": good or {}})


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from hydratune.components.text.tokenizer import build_tokenizer

    return build_tokenizer(str(TINY))


def load(tmp_path: Path, rows: list[dict[str, Any]], **knobs: Any) -> Any:
    path = write_jsonl(tmp_path / "rows.jsonl", rows)
    return ChatDataset(path=path, eval_fraction=0.0, **knobs).load(scratch_workers())


def trained_text(tokenizer: Any, data: Any, **knobs: Any) -> tuple[list[str], dict[str, Any]]:
    """Each train row's trained tokens decoded (labels != -100), and the preparation's facts."""
    defaults = {"assistant_only": True, "completion_only": True, "max_length": 2048, "packing": False}
    tokens, facts = SFTTokens(**(defaults | knobs), packing_strategy="bfd").prepare(
        data, tokenizer, scratch_workers()
    )
    texts = [
        tokenizer.decode([t for t, label in zip(ids, labels, strict=True) if label != IGNORE])
        for ids, labels in zip(tokens["train"]["input_ids"], tokens["train"]["labels"], strict=True)
    ]
    return texts, facts


# ---- per-turn training flags ------------------------------------------------------------------------
SHAPES = {
    "openai weight": ({"weight": 0}, {"weight": 1}),
    "axolotl training": ({"training": False}, {"training": True}),
    "axolotl train": ({"train": False}, {}),
}


@pytest.mark.parametrize("shape", SHAPES)
def test_a_turn_flagged_off_is_context_not_trained(tokenizer, tmp_path, shape) -> None:
    off, on = SHAPES[shape]
    data = load(tmp_path, [two_answers(off, on, i) for i in range(4)])
    assert "rows with assistant turns flagged not to train (data.path)" in data.info
    texts, facts = trained_text(tokenizer, data)
    for i, text in enumerate(texts):
        assert f"GOOD {i}" in text and "BADTURN" not in text, text
    rendered = tokenizer.decode(
        SFTTokens(True, True, 2048, False, "bfd").prepare(data, tokenizer, scratch_workers())[0]["train"][
            "input_ids"
        ][0]
    )
    assert "BADTURN 0" in rendered  # kept as context
    assert facts["counts"]["train"]["rows"] == 4


def test_sharegpt_weight_and_the_hydratune_mask(tokenizer, tmp_path) -> None:
    """ShareGPT turns with weight 0, under a template without generation markers (hydratune's mask)."""
    from hydratune.components.text.chat_template import CHATML

    rows = [
        {
            "conversations": [
                {"from": "human", "value": f"hi {i}"},
                {"from": "gpt", "value": f"BADTURN {i}", "weight": 0},
                {"from": "human", "value": "again"},
                {"from": "gpt", "value": f"GOOD {i}", "weight": 1},
            ]
        }
        for i in range(3)
    ]
    data = load(tmp_path, rows)
    tokenizer = type(tokenizer).from_pretrained(str(TINY))
    tokenizer.chat_template = CHATML  # no {% generation %} markers: hydratune's turn-by-turn mask
    texts, facts = trained_text(tokenizer, data)
    assert facts["plan"]["mask"] == "hydratune"
    assert texts == [f"GOOD {i}<|im_end|>" for i in range(3)]


def test_every_turn_flagged_off_is_refused_before_load(tokenizer, tmp_path) -> None:
    rows = [turns(("user", "hi"), ("assistant", f"x{i}"), **{"1": {"weight": 0}}) for i in range(3)]
    data = load(tmp_path, rows)
    _, facts = trained_text(tokenizer, data)
    assert facts["counts"]["train"]["empty"] == 3
    with pytest.raises(ConfigError) as err:
        check_tokens(ChatDataset(path="x.jsonl"), facts, {"train": 3})
    assert err.value.key == "data.path" and "flagged not to train" in str(err.value)


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ({"weight": 0.5}, "'weight' should be 0 or 1"),
        ({"training": "no"}, "'training' should be true or false"),
        ({"weight": 0, "training": False}, "two training flags"),
    ],
)
def test_a_bad_flag_is_a_row_error(tmp_path, extra, words) -> None:
    with pytest.raises(ConfigError) as err:
        load(tmp_path, [turns(("user", "hi"), ("assistant", "a"), **{"1": extra})] * 2)
    assert words in str(err.value)


def test_a_flag_asking_to_train_a_user_turn_is_refused() -> None:
    from hydratune.components.data.formats import parse_messages

    with pytest.raises(RowError, match="only assistant turns are trained"):
        parse_messages([{"role": "user", "content": "hi", "weight": 1}], "messages", flags=True)
    assert parse_messages([{"role": "user", "content": "hi", "weight": 0}], "messages", flags=True) == [
        {"role": "user", "content": "hi"}
    ]


# ---- every message key used or named ------------------------------------------------------------------
def test_message_keys_not_used_are_named_with_their_rows(tmp_path) -> None:
    rows = [turns(("user", "hi"), ("assistant", "a"), **{"0": {"name": "bob"}}) for _ in range(3)]
    rows += [turns(("user", "hi"), ("assistant", "a"), **{"1": {"refusal": None, "audio": None}})]
    data = load(tmp_path, rows)
    assert data.info["message keys ignored"] == "name (3 rows), refusal (1 rows), audio (1 rows)"
    plain = load(tmp_path, [turns(("user", "hi"), ("assistant", "a"))] * 2)
    assert plain.info["message keys ignored"] == "none"


# ---- reasoning ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("key", ["reasoning_content", "reasoning", "thinking"])
def test_reasoning_reaches_the_template_and_is_trained(tokenizer, tmp_path, key) -> None:
    from hydratune.components.text.chat_template import resolve_chat_template

    rows = [
        turns(("user", f"{i}+1?"), ("assistant", str(i + 1)), **{"1": {key: f"THINK {i}"}}) for i in range(3)
    ]
    data = load(tmp_path, rows)
    assert data["train"][0]["messages"][1]["reasoning_content"] == "THINK 0"
    tokenizer = type(tokenizer).from_pretrained(str(TINY))
    tokenizer.chat_template = resolve_chat_template("qwen3")[0]
    texts, _ = trained_text(tokenizer, data)
    assert all(f"THINK {i}" in t and f"</think>\n\n{i + 1}" in t for i, t in enumerate(texts)), texts


def test_reasoning_of_an_earlier_turn_passes_with_the_template_trl_trains(tokenizer, tmp_path) -> None:
    """qwen3 renders reasoning only after the last user turn; TRL trains with its qwen3_training template,
    which renders every turn's: the check and the tokens use that one."""
    from hydratune.components.data.prepare import fit_template
    from hydratune.components.text.chat_template import resolve_chat_template

    pairs = (("user", "q"), ("assistant", "a"), ("user", "again"), ("assistant", "b"))
    rows = [turns(*pairs, **{"1": {"reasoning_content": f"THINK {i}"}}) for i in range(3)]
    data = load(tmp_path, rows)
    tokenizer = type(tokenizer).from_pretrained(str(TINY))
    tokenizer.chat_template = resolve_chat_template("qwen3")[0]
    data = fit_template(ChatDataset(path="x.jsonl"), data, tokenizer, scratch_workers())
    texts, _ = trained_text(tokenizer, data)
    assert all(f"<think>\nTHINK {i}\n</think>\n\na<|im_end|>" in t for i, t in enumerate(texts)), texts


def test_keep_reasoning_false_drops_and_counts_it(tmp_path) -> None:
    rows = [turns(("user", "q"), ("assistant", "a"), **{"1": {"reasoning_content": "THINK"}})] * 3
    data = load(tmp_path, rows, keep_reasoning=False)
    assert "reasoning_content" not in data["train"][0]["messages"][1]
    assert data.info["message keys ignored"] == "reasoning_content (data.keep_reasoning=false) (3 rows)"


def test_a_template_that_drops_reasoning_is_refused(tokenizer, tmp_path) -> None:
    from hydratune.components.data.prepare import fit_template

    rows = [turns(("user", "q"), ("assistant", "a"), **{"1": {"reasoning_content": "THINK"}})] * 3
    data = load(tmp_path, rows)
    with pytest.raises(ConfigError) as err:
        fit_template(ChatDataset(path="x.jsonl"), data, tokenizer, scratch_workers())
    assert err.value.key == "model.chat_template" and "data.keep_reasoning=false" in err.value.hint


# ---- truncation counted, and refused before load ---------------------------------------------------------
def test_truncation_is_counted_per_split(tokenizer, tmp_path) -> None:
    long = "a long answer that keeps going " * 12
    data = load(tmp_path, [turns(("user", f"q{i}"), ("assistant", long)) for i in range(4)])
    texts, facts = trained_text(tokenizer, data, max_length=40)
    counts = facts["counts"]["train"]
    assert counts["rows"] == 4 and counts["truncated"] == 4 and counts["cut_out"] == 0
    assert counts["tokens_cut"] == counts["longest"] * 4 - 40 * 4  # every row equally long
    assert all("<|im_end|>" not in t for t in texts)  # the stop token was cut: trained text proves it
    line = length_notes(ChatDataset(path="x.jsonl"), facts)["length (train, data.max_length=40)"]
    assert "4 truncated" in line and f"{counts['tokens_cut']:,} tokens cut" in line
    assert "model_max_length" not in line
    past = length_notes(ChatDataset(path="x.jsonl"), facts, context=30)["length (train, data.max_length=40)"]
    assert "past the tokenizer's model_max_length=30" in past
    with pytest.raises(ConfigError) as err:  # most of the answer cut off
        check_tokens(ChatDataset(path="x.jsonl"), facts, {"train": 4})
    assert err.value.key == "data.max_length" and "data.min_trained_fraction" in err.value.hint
    check_tokens(ChatDataset(path="x.jsonl", min_trained_fraction=0.0), facts, {"train": 4})


def test_a_split_left_empty_by_the_cut_is_refused(tokenizer, tmp_path) -> None:
    system = "rules: be precise and polite. " * 30
    rows = [turns(("system", system), ("user", "q"), ("assistant", "a")) for _ in range(3)]
    _, facts = trained_text(tokenizer, load(tmp_path, rows), max_length=64)
    with pytest.raises(ConfigError) as err:
        check_tokens(ChatDataset(path="x.jsonl"), facts, {"train": 3})
    assert err.value.key == "data.max_length" and "no train row is left" in str(err.value)
    longest = facts["counts"]["train"]["longest"]
    assert longest > 64 and f"data.max_length={-(-longest // 256) * 256}" in err.value.hint


def test_your_file_does_not_inherit_the_demos_length(compose_cfg, tmp_path) -> None:
    mine = write_jsonl(tmp_path / "mine.jsonl", [turns(("user", "q"), ("assistant", "a"))] * 3)
    assert compose_cfg().data.max_length == 128  # the demo's rows are short
    assert compose_cfg(f"data.path={mine}").data.max_length == 2048
    assert compose_cfg(f"data.path={mine}", "data.max_length=300").data.max_length == 300
    assert compose_cfg("recipe=dpo", f"data.path={mine}").data.max_length == 1024


# ---- model identity ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def export_dir(tmp_path_factory) -> Path:
    """A model dir as save_pretrained writes it: config.json, tokenizer and safetensors weights."""
    return tiny_export(tmp_path_factory.mktemp("export"), seed=7)


def test_a_dir_with_weights_is_loaded_not_built_at_random(compose_cfg, export_dir) -> None:
    import torch
    from safetensors.torch import load_file

    from hydratune.components.runtime.run import Components

    model = Components.from_config(compose_cfg(f"model.name_or_path={export_dir}")).model
    assert model.init == "pretrained" and "chose pretrained" in model.describe_weights()
    saved = load_file(export_dir / "model.safetensors")
    built = model.build().state_dict()
    assert all(torch.equal(built[name], saved[name]) for name in saved)
    bundled = Components.from_config(compose_cfg()).model  # the bundled tiny dir holds no weights
    assert bundled.init == "random" and "random init" in bundled.describe_weights()
    said = Components.from_config(compose_cfg(f"model.name_or_path={export_dir}", "model.init=random")).model
    assert said.init == "random" and said.describe_weights().endswith("(model.init=random)")


def test_auto_init_on_a_dir_of_yours_without_weights_is_refused(compose_cfg, tmp_path: Path) -> None:
    """Issue 49: config + tokenizer and no weights (a copy that lost its safetensors) trained from random
    init, said only in summary.md; now refused before load naming the files found, unless model.init=random
    says so (the bundled tiny dir, random by design, is unchanged: above)."""
    import shutil

    from hydratune.components.runtime.run import Components

    folder = tmp_path / "my-model"
    shutil.copytree(TINY, folder)
    model = Components.from_config(compose_cfg(f"model.name_or_path={folder}")).model
    with pytest.raises(ConfigError) as err:
        model.validate()
    assert err.value.key == "model.name_or_path" and "model.init=random" in err.value.hint
    assert "model.init=auto" in str(err.value) and "config.json, tokenizer.json" in str(err.value)
    said = Components.from_config(compose_cfg(f"model.name_or_path={folder}", "model.init=random")).model
    said.validate()
    assert said.init == "random"


def test_pretrained_from_a_dir_without_weights_is_refused(compose_cfg) -> None:
    from hydratune.components.runtime.run import Components

    model = Components.from_config(compose_cfg(f"model.name_or_path={TINY}", "model.init=pretrained")).model
    with pytest.raises(ConfigError) as err:
        model.validate()
    assert err.value.key == "model.name_or_path" and "model.init=random" in err.value.hint
