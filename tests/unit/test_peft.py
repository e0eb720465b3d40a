"""Each PEFT option trains exactly the parameters it should (component level, tiny random model)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf
from transformers import LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification

from hydratune.components.config.errors import ConfigError
from hydratune.components.config.registry import REGISTRY, field_names
from hydratune.components.peft import (
    IA3,
    BitFit,
    DoRA,
    Freeze,
    FullFineTune,
    LoRA,
    Peft,
    PrefixTuning,
    PTuning,
    merge_and_unload,
    trainable_summary,
)

REPO = Path(__file__).resolve().parents[2]
VOCAB = 128


def tiny_config(bias: bool = True, **extra: object) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        attention_bias=bias,
        max_position_embeddings=64,
        use_cache=False,
        pad_token_id=0,
        **extra,
    )


def tiny(bias: bool = True, **extra: object) -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(tiny_config(bias, **extra))


@pytest.fixture
def model() -> LlamaForCausalLM:
    return tiny()


@pytest.fixture(scope="module")
def module_names() -> list[str]:
    """What ``check_targets`` gets: the qualified module names of the (meta-device) model."""
    return [n for n, _ in tiny().named_modules()]


def train_steps(model: torch.nn.Module, steps: int = 2) -> dict[str, torch.Tensor]:
    """A couple of real AdamW steps on random tokens (causal-LM loss); returns the state before."""
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    ids = torch.randint(1, VOCAB, (4, 12), generator=torch.Generator().manual_seed(1))
    for _ in range(steps):
        loss = model(input_ids=ids, labels=ids).loss
        assert torch.isfinite(loss)
        loss.backward()
        opt.step()
        opt.zero_grad()
    return before


def changed(model: torch.nn.Module, before: dict[str, torch.Tensor]) -> set[str]:
    """Names of the parameters that are not bit-identical to ``before``."""
    return {k for k, v in model.named_parameters() if not torch.equal(before[k], v)}


def trainable(model: torch.nn.Module) -> set[str]:
    return {n for n, p in model.named_parameters() if p.requires_grad}


# ---- what trains ---------------------------------------------------------------------------------
CASES: list[tuple[Peft, Callable[[str], bool]]] = [
    (FullFineTune(), lambda n: True),
    (LoRA(r=4), lambda n: "lora_" in n),
    (DoRA(r=4), lambda n: "lora_" in n),
    (IA3(), lambda n: "ia3_" in n),
    (BitFit(), lambda n: n.endswith(".bias")),
    (Freeze(last_n_layers=1), lambda n: n.startswith("model.layers.2.")),
    (PrefixTuning(num_virtual_tokens=4), lambda n: n.startswith("prompt_encoder.")),
    (PTuning(num_virtual_tokens=4, encoder_hidden_size=16), lambda n: n.startswith("prompt_encoder.")),
]


@pytest.mark.parametrize(("component", "expect"), CASES, ids=[type(c).__name__ for c, _ in CASES])
def test_exactly_the_intended_parameters_change(
    component: Peft, expect: Callable[[str], bool], model: LlamaForCausalLM
) -> None:
    model = component.apply(model)
    names = {n for n, _ in model.named_parameters()}
    intended = {n for n in names if expect(n)}
    assert intended, "the method adds/keeps nothing to train"
    assert trainable(model) == intended
    before = train_steps(model)
    # every intended parameter moved; every other one is bit-identical
    assert changed(model, before) == intended
    from peft import PeftModel

    assert component.is_adapter == isinstance(model, PeftModel)
    assert (component.peft_config() is None) == (not component.is_adapter)


def test_lora_and_dora_leave_base_weights_untouched(model: LlamaForCausalLM) -> None:
    for component in (LoRA(r=4, target_modules=["q_proj", "v_proj"]), DoRA(r=4)):
        peft_model = component.apply(tiny())
        before = train_steps(peft_model)
        base = {n for n in before if "lora_" not in n}
        assert base and not base & changed(peft_model, before)
    dora = DoRA(r=4).peft_config()
    assert dora.use_dora and not LoRA().peft_config().use_dora


def test_freeze_with_module_patterns() -> None:
    model = Freeze(last_n_layers=1, modules=["lm_head", "norm"]).apply(tiny())
    assert trainable(model) == {
        *(n for n, _ in model.named_parameters() if n.startswith("model.layers.2.")),
        "lm_head.weight",
        "model.norm.weight",
    }  # "norm" is the final norm only: layers 0-1 input_layernorm stay frozen


def test_freeze_trains_a_tied_head_named_by_either_name() -> None:
    model = Freeze(last_n_layers=0, modules=["lm_head"]).apply(tiny(tie_word_embeddings=True))
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert trainable(model) == {"model.embed_tokens.weight"}


def test_freeze_refuses_to_train_nothing(module_names: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        Freeze(last_n_layers=0).validate()
    assert info.value.key == "peft.last_n_layers"
    with pytest.raises(ConfigError, match="no parameter"):
        Freeze(last_n_layers=0, modules=["nothing_like_this"]).apply(tiny())
    with pytest.raises(ConfigError, match="only 3 decoder layers") as info:
        Freeze(last_n_layers=4).check_targets(module_names)
    assert info.value.key == "peft.last_n_layers"


def test_freeze_module_patterns_are_checked_before_loading(module_names: list[str]) -> None:
    Freeze(modules=["lm_head", "norm", "lm_head.weight", "*layernorm*"]).check_targets(module_names)
    with pytest.raises(ConfigError) as info:
        Freeze(modules=["no_such_module"]).check_targets(module_names)
    assert info.value.key == "peft.modules" and "q_proj" in str(info.value)


def test_bitfit_extra_modules() -> None:
    model = BitFit(extra_modules=["lm_head"]).apply(tiny())
    assert trainable(model) == {n for n, _ in model.named_parameters() if n.endswith(".bias")} | {
        "lm_head.weight"
    }
    with pytest.raises(ConfigError) as info:
        BitFit(extra_modules=["nope"]).check_targets([n for n, _ in model.named_modules()])
    assert info.value.key == "peft.extra_modules"


def test_bitfit_without_biases_fails_clearly() -> None:
    with pytest.raises(ConfigError, match="BitFit") as info:
        BitFit().apply(tiny(bias=False))
    assert "would train nothing" in str(info.value) and "peft=lora" in str(info.value)


# ---- reward models (SEQ_CLS) ---------------------------------------------------------------------
def tiny_classifier() -> LlamaForSequenceClassification:
    torch.manual_seed(0)
    return LlamaForSequenceClassification(tiny_config(num_labels=1))


@pytest.mark.parametrize("component", [LoRA(r=4), IA3()], ids=["LoRA", "IA3"])
def test_adapters_on_reward_models_save_and_train_the_score_head(component: Peft) -> None:
    component = component.for_task("seq_cls")  # what Session.build_model(task="seq_cls") applies
    assert "score" in component.peft_config().modules_to_save
    model = component.apply(tiny_classifier())
    assert any(n.endswith("score.modules_to_save.default.weight") for n in trainable(model))
    ids = torch.randint(1, VOCAB, (2, 8))
    assert model(input_ids=ids).logits.shape == (2, 1)


@pytest.mark.parametrize("component", [Freeze(last_n_layers=1), BitFit()], ids=["Freeze", "BitFit"])
def test_freeze_and_bitfit_keep_a_fresh_score_head_trainable(component: Peft) -> None:
    assert "score.weight" in trainable(component.apply(tiny_classifier()))


# ---- targets checked before weights load ---------------------------------------------------------
def test_lora_targets_checked_against_module_names(module_names: list[str]) -> None:
    LoRA(target_modules=["q_proj", "v_proj"]).check_targets(module_names)
    LoRA(target_modules="all-linear").check_targets(module_names)
    LoRA(target_modules="q_proj").check_targets(module_names)  # a bare name, as a one-item list
    LoRA(target_modules=r".*\.(q|v)_proj").check_targets(module_names)  # a regex on full names
    IA3(target_modules=["k_proj", "down_proj"], feedforward_modules=["down_proj"]).check_targets(module_names)
    with pytest.raises(ConfigError) as info:
        LoRA(target_modules=["nope_proj"]).check_targets(module_names)
    message = str(info.value)
    assert info.value.key == "peft.target_modules" and "nope_proj" in message
    assert all(leaf in message for leaf in ("q_proj", "v_proj", "down_proj", "lm_head"))
    assert "layernorm" not in message and "embed_tokens" not in message  # linear leaves only
    with pytest.raises(ConfigError) as info:
        DoRA(target_modules=r"q_proj").check_targets(["model.attn.qproj"])
    with pytest.raises(ConfigError, match="regex") as info:
        LoRA(target_modules=r"q_.*").check_targets(module_names)  # must match the whole name
    with pytest.raises(ConfigError) as info:
        IA3(target_modules=["nope_proj"], feedforward_modules=[]).check_targets(module_names)
    assert info.value.key == "peft.target_modules"
    with pytest.raises(ConfigError) as info:
        LoRA(modules_to_save=["no_head"]).check_targets(module_names)
    assert info.value.key == "peft.modules_to_save"


def test_a_bare_target_name_works_like_a_list(model: LlamaForCausalLM) -> None:
    peft_model = LoRA(r=4, target_modules="q_proj").apply(model)
    assert {n.split(".")[-4] for n in trainable(peft_model)} == {"q_proj"}


@pytest.mark.parametrize(
    ("cls", "values", "key"),
    [
        (LoRA, {"r": 0}, "peft.r"),
        (LoRA, {"alpha": 0}, "peft.alpha"),
        (LoRA, {"dropout": 1.0}, "peft.dropout"),
        (PrefixTuning, {"num_virtual_tokens": 0}, "peft.num_virtual_tokens"),
        (Freeze, {"last_n_layers": -1}, "peft.last_n_layers"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_out_of_range_settings_are_config_errors_naming_the_key(cls: type, values: dict, key: str) -> None:
    """Each knob's range is declared on its field and checked before the component is built (check_values)."""
    from hydratune.components.config.ranges import check_knobs

    with pytest.raises(ConfigError) as info:
        check_knobs(cls.__schema__, values, "peft")  # type: ignore[attr-defined]
    assert info.value.key == key and "must be" in str(info.value)


@pytest.mark.parametrize(
    ("component", "key"),
    [
        (LoRA(bias="some"), "peft.bias"),
        (LoRA(init_lora_weights="eva"), "peft.init_lora_weights"),
        (LoRA(init_lora_weights="random"), "peft.init_lora_weights"),
        (LoRA(target_modules=[]), "peft.target_modules"),
        (LoRA(target_modules="(unclosed"), "peft.target_modules"),
        (DoRA(task_type="TOKEN_CLS"), "peft.task_type"),
        (IA3(feedforward_modules=["gate_proj"]), "peft.feedforward_modules"),
        (PTuning(encoder_reparameterization_type="GRU"), "peft.encoder_reparameterization_type"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_bad_settings_are_config_errors_naming_the_key(component: Peft, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        component.validate()
    assert info.value.key == key
    with pytest.raises(ConfigError):  # apply validates too, before touching the model
        component.apply(tiny())


def test_valid_lora_inits_pass() -> None:
    for init in (True, False, "gaussian", "pissa_niter_4", "orthogonal"):
        LoRA(init_lora_weights=init).validate()


# ---- merge ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("component", [LoRA(r=4), IA3()], ids=["LoRA", "IA3"])
def test_merge_folds_the_adapter_in(component: Peft, model: LlamaForCausalLM) -> None:
    peft_model = component.apply(model)
    train_steps(peft_model)
    peft_model.eval()  # no adapter dropout
    ids = torch.randint(1, VOCAB, (2, 8))
    with torch.no_grad():
        expected = peft_model(input_ids=ids).logits
        merged = merge_and_unload(peft_model)
        assert isinstance(merged, LlamaForCausalLM)
        assert not any("lora_" in n or "ia3_" in n for n, _ in merged.named_parameters())
        torch.testing.assert_close(merged(input_ids=ids).logits, expected, atol=1e-5, rtol=1e-4)


def test_merge_refuses_prompt_learning_and_passes_plain_models_through(model: LlamaForCausalLM) -> None:
    assert merge_and_unload(model) is model
    with pytest.raises(ConfigError, match="cannot be merged") as info:
        merge_and_unload(PTuning(num_virtual_tokens=4).apply(tiny()))
    assert info.value.key == "merge"


# ---- config plumbing -----------------------------------------------------------------------------
def test_trainable_summary(model: LlamaForCausalLM) -> None:
    total = sum(p.numel() for p in model.parameters())
    assert trainable_summary(model) == f"trainable {total:,} / {total:,} params (100.00%)"
    BitFit().apply(model)
    n = sum(p.numel() for name, p in model.named_parameters() if name.endswith("bias"))
    assert trainable_summary(model) == f"trainable {n:,} / {total:,} params ({100 * n / total:.2f}%)"


OPTIONS = sorted((REPO / "conf" / "peft").glob("*.yaml"))


@pytest.mark.parametrize("path", OPTIONS, ids=[p.stem for p in OPTIONS])
def test_yaml_options_set_only_what_differs_from_the_default_and_instantiate(path: Path) -> None:
    assert path.read_text().startswith("# "), "first line: a comment saying what the option does"
    node = OmegaConf.load(path)
    name = node.defaults[0].removeprefix("/schema/peft/").removesuffix("@_here_")
    cls = REGISTRY["peft"][name]
    assert node.defaults == [f"/schema/peft/{name}@_here_", "_self_"]
    assert node._target_ == f"hydratune.components.peft.{name}"
    options = OmegaConf.to_container(node)
    del options["defaults"], options["_target_"]
    defaults = {f.name: getattr(cls(), f.name) for f in dataclasses.fields(cls)}
    assert set(options) <= set(field_names(cls))
    assert not {k: v for k, v in options.items() if v == defaults[k]}  # the schema gives the defaults
    merged = OmegaConf.merge(OmegaConf.structured(cls.__schema__), options)
    component = instantiate(merged, _convert_="all")
    assert type(component) is cls and component == cls()


def test_every_component_has_an_option() -> None:
    named = {OmegaConf.load(p).defaults[0].split("/")[-1].split("@")[0] for p in OPTIONS}
    assert named == set(REGISTRY["peft"])
