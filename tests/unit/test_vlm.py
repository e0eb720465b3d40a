"""Vision-language models, the model side (docs/vlm.md): every shipped VLM option's numbers and part names
against transformers' meta-device model, the refusals before load, LoRA's default targets, the estimate's
vision terms and the plan's vision line. No weights are read (the tiny VLM is built at random: 0.8 M)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra.utils import instantiate

from hydratune.components.config.errors import ConfigError
from hydratune.components.memory.arch import param_counts
from hydratune.components.memory.estimate import estimate
from hydratune.components.memory.spec import arch_of_model, spec_from_config

#: every model option whose config has a vision_config (test_vlm_options_are_all_here keeps the list whole)
VLM_OPTIONS = (
    "tiny_vlm",
    "qwen2_5_vl_3b",
    "qwen2_5_vl_7b",
    "qwen3_vl_8b",
    "smolvlm_256m",
    "gemma3_4b",
    "llava1_5_7b",
)


@pytest.fixture(scope="module")
def meta_vlms() -> dict[str, dict]:
    """Each VLM option built on the meta device as the model component builds it (no memory, no weights):
    its parameters per part (tied ones once) and the names no part claims."""
    import torch
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    from hydratune.components.modeling.vision import part_params

    out = {}
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="hydratune.conf", version_base=None):
        for name in VLM_OPTIONS:
            cfg = compose(config_name="config", overrides=[f"model={name}"])
            model = instantiate(cfg.model, _convert_="all")
            with torch.device("meta"):
                built = model.auto_class().from_config(model.load_config())
            family = model.vision_family
            out[name] = {
                "cfg": cfg,
                "parts": part_params(built, family),
                "total": sum(p.numel() for p in built.parameters()),
                "unclaimed": [n for n, _ in built.named_parameters() if family.part_of(n) is None],
            }
    GlobalHydra.instance().clear()
    return out


def test_vlm_options_are_all_here() -> None:
    """A new VLM option is counted below: the list is every model option with a vision_config."""
    from hydratune.components.config.options import options

    vision = {
        name
        for name, option in options("model").items()
        if "vision_config" in (option.node.get("architecture") or {})
    }
    assert vision | {"tiny_vlm"} == set(VLM_OPTIONS)


@pytest.mark.parametrize("name", VLM_OPTIONS)
def test_every_vlm_option_is_counted_exactly(meta_vlms: dict, name: str) -> None:
    """The estimate's numbers (components/memory/arch.py) equal the model transformers builds, part by part,
    and every parameter belongs to a part (so model.freeze and LoRA's exclusion miss nothing)."""
    m = meta_vlms[name]
    arch = arch_of_model(m["cfg"].model)
    vision = arch.vision
    assert vision is not None
    parts = {part: total for part, (total, _) in m["parts"].items()}
    assert parts["vision_tower"] == vision.tower
    assert parts["projector"] == vision.projector
    assert parts["language_model"] == param_counts(arch).total - vision.params
    assert param_counts(arch).total == m["total"]
    assert not m["unclaimed"], m["unclaimed"][:5]


def test_the_shipped_totals_are_the_published_sizes(meta_vlms: dict) -> None:
    """The options' numbers give the models' published sizes (billions, as their cards round them)."""
    published = {"qwen2_5_vl_3b": 3.75, "qwen2_5_vl_7b": 8.29, "qwen3_vl_8b": 8.77, "gemma3_4b": 4.30}
    for name, billions in published.items():
        assert meta_vlms[name]["total"] / 1e9 == pytest.approx(billions, abs=0.01), name
    assert meta_vlms["smolvlm_256m"]["total"] / 1e6 == pytest.approx(256, abs=1)
    assert meta_vlms["llava1_5_7b"]["total"] / 1e9 == pytest.approx(7.06, abs=0.01)


def test_the_tiny_vlm_is_offline_and_small(compose_cfg) -> None:
    """model=tiny_vlm resolves to the bundled dir (no weights: random init) with its processor, and is
    tiny: 812,608 parameters, 4 image tokens per 56-pixel image."""
    model = instantiate(compose_cfg("model=tiny_vlm").model, _convert_="all")
    assert model.init == "random" and model.is_vision and model.vision_family.model_type == "idefics3"
    folder = Path(model.name_or_path)
    assert {"config.json", "processor_config.json", "tokenizer.json", "chat_template.jinja"} <= {
        p.name for p in folder.iterdir()
    }
    assert sum(p.stat().st_size for p in folder.iterdir()) < 64 * 1024
    arch = arch_of_model(compose_cfg("model=tiny_vlm").model)
    assert param_counts(arch).total == 812_608 and arch.vision.default_image_tokens == 4
    processor = model.build_processor(model.build_tokenizer())
    assert processor.image_seq_len == 4 and processor.tokenizer.convert_tokens_to_ids("<image>") == 603


def test_lora_adapts_the_language_model_only_by_default(compose_cfg) -> None:
    """peft=lora on a VLM puts no adapter on the vision tower or the projector (and the estimate counts
    what peft trains); peft.exclude_modules=[] lets adapters onto them."""
    import torch

    from hydratune.components.modeling.vision import part_params

    def lora_on(*overrides: str) -> tuple[object, object, dict]:
        cfg = compose_cfg("model=tiny_vlm", "peft=lora", *overrides)
        model, peft = instantiate(cfg.model, _convert_="all"), instantiate(cfg.peft, _convert_="all")
        torch.manual_seed(0)
        adapted = peft.for_model(model.adapter_exclusion()).apply(model.build())
        return cfg, peft, part_params(adapted, model.vision_family), adapted

    cfg, peft, parts, adapted = lora_on()
    assert parts["vision_tower"][1] == 0 and parts["projector"][1] == 0
    assert parts["language_model"][1] > 0
    adapters = [n for n, p in adapted.named_parameters() if "lora_" in n]
    assert adapters and all(".text_model." in n for n in adapters), adapters[:3]
    trained = sum(p.numel() for p in adapted.parameters() if p.requires_grad)
    assert peft.trainable_params(arch_of_model(cfg.model)) == trained  # the estimate's count is peft's
    _, _, parts, _ = lora_on("peft.exclude_modules=[]")
    assert parts["vision_tower"][1] > 0 and parts["projector"][1] > 0


@pytest.mark.parametrize(
    ("overrides", "key", "words"),
    [
        (["model.freeze=[vision_tower]"], "model.freeze", "text model"),
        (["model.image_tokens_per_row=64"], "model.image_tokens_per_row", "text model"),
        (["model=tiny_vlm", "model.freeze=[eyes]"], "model.freeze", "unknown part"),
        (
            ["model=tiny_vlm", "model.freeze=[vision_tower,projector,language_model]"],
            "model.freeze",
            "nothing",
        ),
        (["model=tiny_vlm", "peft=lora", "model.freeze=[language_model]"], "model.freeze", "nothing"),
        (["model=tiny_vlm", "model.attn_implementation=varlen_sdpa"], "model.attn_implementation", "packed"),
        (["model=tiny_vlm", "peft=lora", "peft.target_modules=[fc1]"], "peft.target_modules", "fc1"),
        (
            ["model=tiny_vlm", "strategy=zero1", "strategy.tp_size=2", "launcher.nproc_per_node=2"],
            "strategy.tp_size",
            "vision-language",
        ),
        (
            ["model=tiny_vlm", "strategy=pipeline", "launcher.nproc_per_node=2"],
            "strategy.pp_size",
            "splitting",
        ),
        (["model=tiny_vlm", "model.processor={tmp}"], "model.processor", "holds no processor"),
        (["model=tiny_vlm", "+model.architecture.model_type=paligemma"], "model.name_or_path", "not know"),
    ],
)
def test_vision_knobs_are_refused_before_load(
    compose_cfg, monkeypatch, tmp_path, overrides, key, words
) -> None:
    """Each refusal names its key before any weight is read (CausalLM.build would fail the test)."""
    from hydratune.components.model import CausalLM
    from hydratune.components.runtime.checks import check_before_load
    from hydratune.components.runtime.run import Components

    monkeypatch.setattr(CausalLM, "build", lambda *a, **k: pytest.fail("a model was loaded"))
    cfg = compose_cfg(*(o.format(tmp=tmp_path) for o in overrides))
    with pytest.raises(ConfigError) as err:
        comps = Components.from_config(cfg)
        check_before_load(cfg, comps, "cpu")
        comps.model.resolved_attn_implementation()  # what build() asks first
    assert err.value.key == key and words in str(err.value), err.value
    assert err.value.hint


def test_a_bad_freeze_part_exits_2_before_load(capsys, monkeypatch, tmp_path) -> None:
    """The command line: exit 2, the key in brackets, no traceback, nothing loaded."""
    from hydratune.components.model import CausalLM
    from tests.support.cli import in_process

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(CausalLM, "build", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(SystemExit) as code:
        in_process("model=tiny_vlm", "model.freeze=[vision,projector]", "train.max_steps=1")
    err = capsys.readouterr().err
    assert code.value.code == 2 and "[model.freeze]" in err and "vision_tower" in err
    assert "Traceback" not in err


def test_the_estimate_counts_the_vision_tower(compose_cfg) -> None:
    """Qwen2.5-VL-7B: its 0.68 B of vision parameters are in the total; the tower's activations grow with
    the image tokens and vanish when it does not train (LoRA's default, model.freeze=[vision_tower]);
    LoRA trains the same adapters as on the text Qwen2.5-7B (the same decoder)."""
    base = ("model=qwen2_5_vl_7b", "train.micro_batch_size=2", "data.max_length=1024")
    full = estimate(spec_from_config(compose_cfg(*base)))
    assert full.params_total == 8_292_166_656 and full.params_trainable == full.params_total
    tower = full.row("vision activations")
    assert tower > 0 and full.spec.image_tokens == 256
    more = estimate(spec_from_config(compose_cfg(*base, "model.image_tokens_per_row=512")))
    assert more.row("vision activations") == pytest.approx(2 * tower)
    assert more.peak_allocated == pytest.approx(full.peak_allocated + tower)
    frozen = estimate(spec_from_config(compose_cfg(*base, "model.freeze=[vision_tower]")))
    assert frozen.row("vision activations") == 0
    assert frozen.params_trainable == full.params_total - arch_of_model(compose_cfg(*base).model).vision.tower
    assert frozen.row("gradients") < full.row("gradients")
    lora = estimate(spec_from_config(compose_cfg(*base, "peft=lora")))
    text = estimate(spec_from_config(compose_cfg("model=qwen2_5_7b", *base[1:], "peft=lora")))
    assert lora.row("vision activations") == 0 and lora.params_trainable == text.params_trainable
    assert lora.params_total - text.params_total == 631_975_680 + 44_574_464  # tower + merger


def test_plan_prints_the_vision_parts(capsys, monkeypatch, tmp_path) -> None:
    """mode=plan of a real VLM option, offline: its tower, projector and decoder parameters."""
    from hydratune.components.modeling import vision
    from tests.support.cli import in_process

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(vision, "missing_processor_packages", lambda family: [])  # torchvision or not
    in_process("mode=plan", "model=qwen2_5_vl_7b", "peft=lora", "model.freeze=[projector]")
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("# vision:"))
    assert "vision tower 631,975,680 params" in line and "projector 44,574,464" in line
    assert "language model 7,615,616,512" in line and "frozen: projector" in line


@pytest.mark.parametrize(
    ("option", "needs"), [("qwen2_5_vl_7b", True), ("qwen3_vl_8b", True), ("tiny_vlm", False)]
)
def test_a_processor_needing_torchvision_is_refused_naming_the_extra(
    compose_cfg, monkeypatch, option: str, needs: bool
) -> None:
    """Issue 49: Qwen-VL without torchvision was transformers' ImportError once the processor was built;
    transformers' own mapping says which processors need it (a video processor), refused before load."""
    import transformers.utils

    from hydratune.components.runtime.run import Components

    monkeypatch.setattr(transformers.utils, "is_torchvision_available", lambda: False)
    model = Components.from_config(compose_cfg(f"model={option}")).model
    if not needs:
        model.validate()
        return
    with pytest.raises(ConfigError) as err:
        model.validate()
    assert err.value.key == "model.name_or_path" and "needs torchvision" in str(err.value)
    assert "pip install 'hydratune[vision]'" in err.value.hint
    monkeypatch.setattr(transformers.utils, "is_torchvision_available", lambda: True)
    model.validate()


def test_chat_on_a_processor_needing_torchvision_is_refused_before_load(tmp_path, monkeypatch) -> None:
    """Issue 49: ``hydratune chat <Qwen-VL dir>`` without torchvision was transformers' ImportError after the
    model loaded; refused first, naming the extra (a model dir and a run dir whose base is one)."""
    import json

    import transformers.utils
    from transformers import Qwen2_5_VLConfig

    from hydratune.components.commands import chat

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(chat, "load", no_model)
    monkeypatch.setattr(transformers.utils, "is_torchvision_available", lambda: False)
    model_dir = tmp_path / "qwen_vl"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(Qwen2_5_VLConfig().to_dict()))
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / "final").mkdir()
    (run / ".hydra" / "config.yaml").write_text(f"model:\n  name_or_path: {model_dir}\n")
    for path in (model_dir, run):
        with pytest.raises(ConfigError, match="needs torchvision") as err:
            chat.cli([str(path)])
        assert err.value.key == "chat" and "hydratune[vision]" in err.value.hint
    monkeypatch.setattr(transformers.utils, "is_torchvision_available", lambda: True)
    with pytest.raises(AssertionError, match="a model was loaded"):  # with torchvision: on to the load
        chat.cli([str(model_dir)])


def test_freeze_on_a_model_whose_config_is_out_of_reach_says_so(monkeypatch) -> None:
    """A hub id without shipped numbers, offline: model.freeze cannot know the parts, and says why (not
    'a text model')."""
    from hydratune.components.model import CausalLM

    def offline(self):
        raise ConfigError("unreachable", key="model.name_or_path")

    monkeypatch.setattr(CausalLM, "load_config", offline)
    with pytest.raises(ConfigError) as err:
        CausalLM(name_or_path="nobody/some-vlm", freeze=["projector"]).check_vision_knobs()
    assert err.value.key == "model.freeze" and "reachable" in str(err.value)


def test_ddp_finds_a_vlms_unused_tower(compose_cfg) -> None:
    """strategy=ddp on a VLM: a batch without images leaves the tower unused, so DDP must look for unused
    parameters (it died at step 2 without: 'Expected to have finished reduction'); the model says so unless
    strategy.find_unused_parameters is set; a text model keeps DDP's fast path."""
    from hydratune.components.runtime.run import Components

    def args(*overrides: str) -> dict:
        comps = Components.from_config(compose_cfg("strategy=ddp", "launcher.nproc_per_node=2", *overrides))
        return {**comps.model.training_args("cpu"), **comps.strategy.training_args("cpu")}

    assert args("model=tiny_vlm")["ddp_find_unused_parameters"] is True
    assert args()["ddp_find_unused_parameters"] is False
    assert (
        args("model=tiny_vlm", "strategy.find_unused_parameters=false")["ddp_find_unused_parameters"] is False
    )


def test_peft_freeze_opens_the_decoders_last_layers(meta_vlms: dict, compose_cfg) -> None:
    """peft=freeze's last_n_layers are the decoder's, never the image encoder's, even where the encoder has
    more blocks (Qwen2.5-VL-7B: 32 vision blocks, 28 decoder layers)."""
    import torch

    from hydratune.components.peft import count_layers, decoder_layers

    cfg = meta_vlms["qwen2_5_vl_7b"]["cfg"]
    model = instantiate(cfg.model, _convert_="all")
    with torch.device("meta"):
        built = model.auto_class().from_config(model.load_config())
    layers = decoder_layers(built)
    assert len(layers) == 28 and layers[-1][0] == "model.language_model.layers.27"
    assert count_layers([n for n, _ in built.named_modules()]) == 28


@pytest.mark.parametrize(
    "family", ["idefics3", "smolvlm", "llava", "gemma3", "qwen2_vl", "qwen2_5_vl", "qwen3_vl"]
)
def test_every_family_is_counted_at_transformers_defaults(family: str) -> None:
    """Other shapes than the shipped ones (transformers' default configs: SigLIP's pooling head on, a
    SmolVLM class): parts claim every parameter and the arithmetic is exact; qwen2_vl's tower is not
    modelled (the estimate counts its decoder alone and says so; its parts are known)."""
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    from hydratune.components.memory.arch import Arch
    from hydratune.components.modeling.vision import FAMILIES, part_params

    config = AutoConfig.for_model(family)
    with torch.device("meta"):
        built = AutoModelForImageTextToText.from_config(config)
    assert all(FAMILIES[family].part_of(n) for n, _ in built.named_parameters())
    arch = Arch.from_dict(config.to_dict())
    parts = part_params(built, FAMILIES[family])
    if family == "qwen2_vl":
        assert arch.vision is None and "'qwen2_vl' are not modelled" in arch.unmodelled[0]
        unmodelled = parts["vision_tower"][0] + parts["projector"][0]
        assert param_counts(arch).total == sum(p.numel() for p in built.parameters()) - unmodelled
        return
    assert (parts["vision_tower"][0], parts["projector"][0]) == (arch.vision.tower, arch.vision.projector)
    assert param_counts(arch).total == sum(p.numel() for p in built.parameters())


def unstamped(doc: object) -> object:
    """``doc`` without the ``transformers_version`` keys transformers writes into every config it saves:
    a newer transformers regenerates the same model with its own version stamp."""
    if isinstance(doc, dict):
        return {k: unstamped(v) for k, v in doc.items() if k != "transformers_version"}
    if isinstance(doc, list):
        return [unstamped(v) for v in doc]
    return doc


def test_the_bundled_tiny_vlm_is_what_its_script_makes(tmp_path) -> None:
    """scripts/make_tiny_vlm.py regenerates components/assets/tiny_vlm byte for byte, and its tokenizer is
    model=tiny's (every id the same) plus the 40 image tokens after it."""
    import importlib.util
    import json

    script = Path(__file__).resolve().parents[2] / "scripts" / "make_tiny_vlm.py"
    spec = importlib.util.spec_from_file_location("make_tiny_vlm", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(tmp_path / "tiny_vlm")
    shipped = module.OUT
    assert sorted(p.name for p in shipped.iterdir()) == sorted(
        p.name for p in (tmp_path / "tiny_vlm").iterdir()
    )
    for path in shipped.iterdir():
        made = (tmp_path / "tiny_vlm" / path.name).read_bytes()
        if path.suffix == ".json":  # the same but for the version stamp of whichever transformers wrote it
            assert unstamped(json.loads(path.read_bytes())) == unstamped(json.loads(made)), path.name
        else:
            assert path.read_bytes() == made, path.name
    tiny = json.loads((module.TINY / "tokenizer.json").read_text())["model"]["vocab"]
    vlm = json.loads((shipped / "tokenizer.json").read_text())
    assert vlm["model"]["vocab"] == tiny
    added = {t["content"]: t["id"] for t in vlm["added_tokens"]}
    assert {added[t] for t in module.IMAGE_TOKENS + module.TILE_TOKENS} == set(range(602, 642))
