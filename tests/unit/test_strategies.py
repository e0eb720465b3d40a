"""Strategies, precision and quantization: generated DeepSpeed / FSDP settings, the checks that run
before any model is loaded, and accelerate's silent fallbacks caught by ``Strategy.verify``."""

from __future__ import annotations

import dataclasses
import json
import os
from types import SimpleNamespace

import pytest

from hydratune.components.config.errors import ConfigError
from hydratune.components.runtime.checks import check_before_load, stale_accelerate_env
from hydratune.components.runtime.run import Components, batch_plan

DEEPSPEED = ("zero0", "zero1", "zero2", "zero3", "zero2_offload", "zero3_offload", "zero3_nvme", "zero3pp")
PRECISIONS = ("fp32", "bf16", "fp16")


def contains_auto(node: object) -> bool:
    if isinstance(node, dict):
        return any(contains_auto(v) for v in node.values())
    if isinstance(node, list):
        return any(contains_auto(v) for v in node)
    return node == "auto"


def ds_config(compose_cfg, strategy: str, dtype: str, *extra: str, world: int = 1, device: str = "cuda"):
    cfg = compose_cfg(
        f"strategy={strategy}",
        f"launcher.nproc_per_node={world}",
        "strategy.nvme_path=/local_nvme",
        *extra,
    )
    comps = Components.from_config(cfg)
    plan = dataclasses.replace(batch_plan(cfg, comps, "cpu"), dtype=dtype)  # as resolved on a GPU
    return comps.strategy.deepspeed_config(plan, device), comps


@pytest.mark.parametrize("dtype", PRECISIONS)
@pytest.mark.parametrize("strategy", DEEPSPEED)
def test_generated_deepspeed_config_is_concrete_and_accepted(compose_cfg, strategy: str, dtype: str) -> None:
    from deepspeed.runtime.config import DeepSpeedConfig

    config, comps = ds_config(
        compose_cfg,
        strategy,
        dtype,
        "train.micro_batch_size=4",
        "train.gradient_accumulation_steps=8",
        world=2,
    )
    assert not contains_auto(config)
    assert config["train_micro_batch_size_per_gpu"] == 4
    assert config["gradient_accumulation_steps"] == 8
    assert config["train_batch_size"] == 4 * 8 * 2  # micro x accumulation x world size
    assert config["gradient_clipping"] == 1.0
    assert config["bf16"]["enabled"] is (dtype == "bf16")
    assert config["fp16"]["enabled"] is (dtype == "fp16")
    if dtype == "fp16":
        assert config["fp16"]["loss_scale"] == 0.0 and config["fp16"]["initial_scale_power"] == 16
    zero = config["zero_optimization"]
    assert zero["stage"] == comps.strategy.stage
    if zero["stage"] >= 1:
        assert zero["reduce_bucket_size"] == 128 * 128  # hidden² of the tiny model
    if zero["stage"] == 3:
        assert zero["stage3_prefetch_bucket_size"] == int(0.9 * 128 * 128)
        assert zero["stage3_param_persistence_threshold"] == 10 * 128
        assert zero["stage3_gather_16bit_weights_on_model_save"] is True
    if "offload" in strategy:
        assert zero["offload_optimizer"]["device"] == "cpu"
        assert "optimizer" in config and config["optimizer"]["params"]["betas"] == [0.9, 0.95]
    if strategy == "zero3_offload":
        assert zero["offload_param"] == {"device": "cpu", "pin_memory": True}
    if strategy == "zero3_nvme":
        assert zero["offload_param"]["nvme_path"] == "/local_nvme" and "aio" in config
        assert zero["offload_param"]["buffer_size"] == 602 * 128 // 2  # tiny: vocab x hidden / world
        assert config["aio"]["intra_op_parallelism"] == 1 and "thread_count" not in config["aio"]
    if strategy == "zero3pp":
        assert zero["zero_quantized_weights"] and zero["zero_quantized_gradients"]
        assert zero["zero_hpz_partition_size"] == 2  # null: the GPUs per node (launcher.nproc_per_node)
    checked = dict(config, train_batch_size=4 * 8)  # DeepSpeed's class counts this process only
    DeepSpeedConfig(checked)


@pytest.mark.parametrize("world", [1, 8])
def test_nvme_param_buffers_hold_the_largest_shard_of_llama3_8b(compose_cfg, world: int) -> None:
    """DeepSpeed asserts every parameter shard fits one swap buffer: its 1e8 default is smaller than
    Llama-3-8B's embedding (128256 x 4096 = 525M elements). The derived size is that shard, rounded up."""
    from deepspeed.runtime.config import DeepSpeedConfig

    config, _ = ds_config(compose_cfg, "zero3_nvme", "bf16", "model=llama3_8b", world=world)
    offload = config["zero_optimization"]["offload_param"]
    assert offload["buffer_size"] == -(-128256 * 4096 // world) >= 128256 * 4096 / world
    assert offload["buffer_count"] == 5 and offload["nvme_path"] == "/local_nvme"
    ds = DeepSpeedConfig(dict(config, train_batch_size=config["train_micro_batch_size_per_gpu"]
                              * config["gradient_accumulation_steps"]))  # fmt: skip
    assert ds.zero_config.offload_param.buffer_size == offload["buffer_size"]
    assert ds.aio_config["intra_op_parallelism"] == 1
    knob, _ = ds_config(compose_cfg, "zero3_nvme", "bf16", "strategy.offload_param_buffer_size=6e8")
    assert knob["zero_optimization"]["offload_param"]["buffer_size"] == 600_000_000


@pytest.mark.parametrize(("overrides", "hpz"), [
    (["launcher.nproc_per_node=4"], 4),
    (["launcher.nproc_per_node=4", "launcher.nnodes=2"], 4),  # secondary copy within each node
    (["launcher.nproc_per_node=8", "strategy.zero_hpz_partition_size=2"], 2),
])  # fmt: skip
def test_zero3pp_hpz_partition_follows_the_gpus_per_node(compose_cfg, overrides, hpz: int) -> None:
    cfg = compose_cfg("strategy=zero3pp", *overrides)
    comps = Components.from_config(cfg)
    check_before_load(cfg, comps, "cuda")
    config = comps.strategy.deepspeed_config(batch_plan(cfg, comps, "cuda"))
    assert config["zero_optimization"]["zero_hpz_partition_size"] == hpz


def test_user_knobs_reach_the_generated_config(compose_cfg) -> None:
    config, _ = ds_config(
        compose_cfg,
        "zero3",
        "bf16",
        "strategy.reduce_bucket_size=2e8",
        "strategy.stage3_max_live_parameters=3e8",
        "strategy.overlap_comm=false",
        "strategy.communication_data_type=fp32",
        "strategy.sub_group_size=5e8",
        "strategy.round_robin_gradients=true",
        "strategy.stage3_gather_16bit_weights_on_model_save=false",
        "train.max_grad_norm=0.5",
    )
    zero = config["zero_optimization"]
    assert zero["reduce_bucket_size"] == 200_000_000
    assert zero["stage3_max_live_parameters"] == 300_000_000
    assert zero["overlap_comm"] is False
    assert zero["sub_group_size"] == 500_000_000
    assert zero["round_robin_gradients"] is True
    assert zero["stage3_gather_16bit_weights_on_model_save"] is False
    assert config["communication_data_type"] == "fp32"
    assert config["gradient_clipping"] == 0.5


def test_cpu_offload_keeps_the_torch_optimizer(compose_cfg) -> None:
    """On a CPU host DeepSpeed's CPU Adam would need a ~60 s JIT build: the torch optimizer is used."""
    config, _ = ds_config(compose_cfg, "zero2_offload", "fp32", device="cpu")
    assert "optimizer" not in config and config["zero_force_ds_cpu_optimizer"] is False


def test_deepspeed_training_args_and_trainer_agree(compose_cfg, tmp_path) -> None:
    """Micro-batch, accumulation and clipping come from one source: the trainer accepts the config."""
    from transformers import TrainingArguments

    from hydratune.components.runtime.run import RunContext
    from hydratune.components.runtime.rundir import RunDir

    cfg = compose_cfg("strategy=zero2", "train.micro_batch_size=4", "train.gradient_accumulation_steps=3")
    comps = Components.from_config(cfg)
    ctx = RunContext(cfg, comps, RunDir(tmp_path / "run"), "cpu")
    args = TrainingArguments(**ctx.training_args())
    ds = args.hf_deepspeed_config.config
    assert ds["train_micro_batch_size_per_gpu"] == args.per_device_train_batch_size == 4
    assert ds["gradient_accumulation_steps"] == args.gradient_accumulation_steps == 3
    assert not contains_auto(ds)


@pytest.mark.parametrize("extra", [[], ["strategy.cpu_offload=true", "strategy.reshard_after_forward=false"]])
def test_fsdp_plugin_is_fsdp2_with_the_requested_knobs(compose_cfg, extra: list[str], tmp_path) -> None:
    """accelerate cannot run FSDP on CPU; the plugin it would get is built and checked here."""
    from accelerate.utils import FullyShardedDataParallelPlugin
    from transformers import TrainingArguments

    comps = Components.from_config(compose_cfg("strategy=fsdp", *extra))
    args = TrainingArguments(output_dir=str(tmp_path), **comps.strategy.training_args("cuda"))
    plugin_args = args.fsdp_plugin_args
    assert plugin_args["fsdp_version"] == 2
    assert plugin_args["auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP"
    assert plugin_args.get("cpu_offload", False) is comps.strategy.cpu_offload
    assert plugin_args["reshard_after_forward"] is comps.strategy.reshard_after_forward
    plugin = FullyShardedDataParallelPlugin(**plugin_args)
    assert plugin.fsdp_version == 2
    assert plugin.state_dict_type.name == "FULL_STATE_DICT"


def fake_accelerator(kind: str, processes: int = 1, stage: int | None = None, fsdp_version: int = 2):
    plugin = SimpleNamespace(zero_stage=stage) if stage is not None else None
    state = SimpleNamespace(deepspeed_plugin=plugin, fsdp_plugin=SimpleNamespace(fsdp_version=fsdp_version))
    return SimpleNamespace(distributed_type=f"DistributedType.{kind}", num_processes=processes, state=state)


@pytest.mark.parametrize(
    ("strategy", "live", "processes", "stage", "message"),
    [
        ("zero2", "MULTI_CPU", 2, None, "accelerate prepared 'MULTI_CPU'"),  # DeepSpeed silently dropped
        ("zero3", "DEEPSPEED", 2, 2, "ZeRO stage 3 but DeepSpeed runs stage 2"),
        ("fsdp", "MULTI_GPU", 2, None, "accelerate prepared 'MULTI_GPU'"),  # FSDP fell back to DDP
        ("ddp", "MULTI_CPU", 1, None, r"1 process\(es\)"),  # `accelerate launch --cpu` ran one process
    ],
)
def test_verify_refuses_a_silent_fallback(compose_cfg, strategy, live, processes, stage, message) -> None:
    comps = Components.from_config(compose_cfg(f"strategy={strategy}"))
    with pytest.raises(ConfigError, match=message):
        comps.strategy.verify(fake_accelerator(live, processes, stage), world_size=2)


@pytest.mark.parametrize(
    ("live", "message"),
    [
        ("FSDP", "accelerate prepared 'FSDP'"),  # the loop shards itself: accelerate's plugin must stay out
        ("MULTI_CPU", r"unsharded: \['Linear'\]"),  # a module left whole on every rank
    ],
)
def test_fsdp_loop_verify_refuses_whole_modules(compose_cfg, live, message) -> None:
    """PPO's FSDP2 loop: a plain multi-process accelerator, and every trained module an FSDP unit."""
    import torch

    comps = Components.from_config(compose_cfg("strategy=fsdp"))
    with pytest.raises(ConfigError, match=message):
        comps.strategy.verify_loop(fake_accelerator(live, 2), 2, [torch.nn.Linear(2, 1)])


def test_fsdp_layer_classes_that_match_nothing_are_refused() -> None:
    """A misspelt ``transformer_layer_cls_to_wrap`` would leave the whole model one unit: refused."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from hydratune.components.distributed import fully_shard

    model = LlamaForCausalLM(LlamaConfig(hidden_size=8, intermediate_size=8, num_hidden_layers=1,
                                         num_attention_heads=2, vocab_size=16))  # fmt: skip
    assert fully_shard.layer_class_names(model, None) == {"LlamaDecoderLayer"}
    assert fully_shard.layer_class_names(model.lm_head, ["LlamaDecoderLayer"]) == set()  # a head: one unit
    with pytest.raises(ConfigError) as info:
        fully_shard.shard(model, device="cpu", layer_classes={"LlamaLayer"}, reshard_after_forward=True,
                   cpu_offload=False, mixed_precision="no")  # fmt: skip
    assert info.value.key == "strategy.transformer_layer_cls_to_wrap"


def test_verify_accepts_what_was_asked(compose_cfg) -> None:
    comps = Components.from_config(compose_cfg("strategy=zero3"))
    comps.strategy.verify(fake_accelerator("DEEPSPEED", 2, 3), world_size=2)


def test_verify_catches_accelerate_dropping_deepspeed_on_cpu(compose_cfg) -> None:
    """The real fallback: ``Accelerator(cpu=True, deepspeed_plugin=…)`` runs without DeepSpeed."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState
    from accelerate.utils import DeepSpeedPlugin

    comps = Components.from_config(compose_cfg("strategy=zero2"))
    try:
        accelerator = Accelerator(cpu=True, deepspeed_plugin=DeepSpeedPlugin(zero_stage=2))
        with pytest.raises(ConfigError, match="asked for strategy DeepSpeed"):
            comps.strategy.verify(accelerator)
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)


def test_stale_accelerate_variables_are_dropped(monkeypatch) -> None:
    for key in [k for k in os.environ if k.startswith(("ACCELERATE_", "FSDP_"))]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp16")
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_LOG_LEVEL", "info")
    assert stale_accelerate_env() == ["ACCELERATE_MIXED_PRECISION", "ACCELERATE_USE_DEEPSPEED"]
    assert "ACCELERATE_MIXED_PRECISION" not in os.environ and os.environ["ACCELERATE_LOG_LEVEL"] == "info"


# (overrides, key the error names, words of the message) — each fails before any model is loaded
INVALID = [
    (["quantization=nf4", "peft=none"], "peft", "QLoRA trains an adapter"),
    (["quantization=int8", "peft=lora", "merge=true"], "merge", "quantized base"),
    (
        ["quantization=nf4", "peft=lora", "strategy=zero3"],
        "quantization.quant_storage",
        "training dtype",
    ),
    (["quantization=int8", "peft=lora", "strategy=zero3"], "quantization", "8-bit"),
    (["quantization=nf4", "quantization.bits=3"], "quantization.bits", None),
    (["quantization=nf4", "quantization.quant_type=int3"], "quantization.quant_type", None),
    (["strategy=fsdp"], "strategy", "FSDP needs GPUs"),
    (["strategy=zero2", "precision=bf16"], "precision", "fp32 only"),
    (["strategy=single", "launcher.nproc_per_node=2"], "strategy", "one process"),
    (["strategy=zero2", "strategy.offload_param=cpu"], "strategy.offload_param", "stage 3"),
    (["strategy=zero0", "strategy.offload_optimizer=cpu"], "strategy.offload_optimizer", None),
    (["strategy=zero3_nvme", "strategy.nvme_path=null"], "strategy.nvme_path", "swap directory"),
    (["strategy=zero3_nvme"], "strategy.nvme_path", "swap directory"),  # required: no default dir
    (["strategy=zero3pp", "launcher.nproc_per_node=2"], "strategy.zero_quantized_weights", "CUDA"),
    (
        ["strategy=zero3_nvme", "strategy.nvme_path=/n", "+strategy.aio.thread_count=2"],
        "strategy.aio.thread_count",
        "intra_op_parallelism",
    ),  # DeepSpeed 0.19 would ignore it
    (
        ["strategy=zero3pp", "launcher.nproc_per_node=4", "strategy.zero_hpz_partition_size=3"],
        "strategy.zero_hpz_partition_size",
        "does not divide",
    ),
    (["strategy=zero2", "strategy.zero_quantized_weights=true"], "strategy.stage", "ZeRO++"),
    (["strategy=zero3", "strategy.stage=5"], "strategy.stage", None),
    (["strategy=zero3", "peft=lora", "merge=true"], "merge", "sharded"),
    (["optimizer=paged_adamw_8bit"], "optimizer", "CUDA"),
    (["optimizer=adamw_8bit", "optimizer.bits=4"], "optimizer.bits", None),
    (["precision=fp16"], "precision", "GPU"),
]


@pytest.mark.parametrize(("overrides", "key", "words"), INVALID, ids=[" ".join(o) for o, _, _ in INVALID])
def test_invalid_combinations_fail_before_model_load(compose_cfg, monkeypatch, overrides, key, words) -> None:
    import hydratune.components.model

    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(hydratune.components.model.CausalLM, "build", no_loading)
    cfg = compose_cfg(*overrides)
    with pytest.raises(ConfigError) as err:
        check_before_load(cfg, Components.from_config(cfg))
    assert err.value.key == key
    if words:
        assert words in str(err.value)


def test_qlora_error_says_how_to_add_an_adapter(compose_cfg) -> None:
    cfg = compose_cfg("quantization=nf4", "peft=none")
    with pytest.raises(ConfigError) as err:
        check_before_load(cfg, Components.from_config(cfg))
    assert "peft=lora" in str(err.value)


def test_nf4_config_follows_precision(compose_cfg) -> None:
    import torch

    comps = Components.from_config(compose_cfg("quantization=nf4", "peft=lora"))
    config = comps.quantization.config("bf16")
    assert config.load_in_4bit and config.bnb_4bit_quant_type == "nf4"
    assert config.bnb_4bit_use_double_quant is True
    assert config.bnb_4bit_compute_dtype == torch.bfloat16
    int8 = Components.from_config(compose_cfg("quantization=int8", "peft=lora")).quantization.config("fp32")
    assert int8.load_in_8bit and int8.llm_int8_threshold == 6.0


def test_plan_prints_the_generated_deepspeed_config(capsys) -> None:
    from hydratune.recipes.cli import main

    overrides = [
        "strategy=zero3",
        "precision=bf16",
        "train.micro_batch_size=4",
        "train.gradient_accumulation_steps=2",
    ]
    main(["mode=plan", *overrides])
    out = capsys.readouterr().out
    assert "deepspeed.json:" in out and "train_batch_size: 8" in out
    assert "bf16:\n    enabled: true" in out
    if not __import__("torch").cuda.is_available():  # a laptop checks a cluster config
        assert "planned for a GPU" in out
    assert "global_batch_size: 4 x 2 x 1 = 8" in out
    assert "auto" not in out.split("# generated by the strategy")[1].replace("optimizer_impl", "")


def test_plan_json_round_trip_is_valid(compose_cfg) -> None:
    config, _ = ds_config(compose_cfg, "zero3_offload", "bf16")
    assert json.loads(json.dumps(config)) == config


@pytest.mark.parametrize(
    ("nodelist", "host"),
    [("gpu[03-04,07],cpu1", "gpu03"), ("node7", "node7"), ("a-1,b-2", "a-1"), ("n[1]", "n1")],
)
def test_slurm_master_is_the_first_host_of_the_allocation(nodelist: str, host: str) -> None:
    from hydratune.components.launcher import first_host

    assert first_host(nodelist) == host


SCALER = ["precision=fp16", "precision.initial_scale_power=12", "precision.loss_scale_window=200"]


def test_fp16_loss_scaling_knobs_reach_the_trainers_grad_scaler(compose_cfg, tmp_path) -> None:
    """Outside DeepSpeed the knobs reach accelerate's GradScaler through a kwargs handler: here the real
    Trainer's Accelerator (fp16 itself needs a GPU, so the run is fp32 and the handler is what is checked)."""
    from transformers import Trainer, TrainingArguments

    from hydratune.components.runtime.trainer_hooks import LossScaling

    cfg = compose_cfg(*SCALER)
    comps = Components.from_config(cfg)
    check_before_load(cfg, comps, "cuda")  # single + fp16 on a GPU: the dynamic knobs are accepted
    handlers = comps.precision.scaler_handlers("fp16")
    assert [h.to_kwargs() for h in handlers] == [{"init_scale": 4096.0, "growth_interval": 200}]
    assert comps.precision.scaler_handlers("bf16") == []
    trainer_cls = type("T", (LossScaling, Trainer), {"scaler_handlers": tuple(handlers)})
    import torch

    trainer = trainer_cls(model=torch.nn.Linear(2, 2), args=TrainingArguments(str(tmp_path), use_cpu=True))
    assert trainer.accelerator.scaler_handler is handlers[0]


def test_fp16_loss_scaling_knobs_reach_a_loops_grad_scaler(compose_cfg, monkeypatch) -> None:
    """PPO's own loop (single / DDP): the Accelerator it makes carries the same handler."""
    import accelerate

    made: dict = {}
    monkeypatch.setattr(accelerate, "Accelerator", lambda **kwargs: made.update(kwargs))
    cfg = compose_cfg(*SCALER, "strategy=ddp")
    comps = Components.from_config(cfg)
    comps.strategy.loop_accelerator("cuda", batch_plan(cfg, comps, "cuda"))
    assert made["mixed_precision"] == "fp16"
    assert [h.to_kwargs() for h in made["kwargs_handlers"]] == [
        {"init_scale": 4096.0, "growth_interval": 200}
    ]


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["precision.loss_scale=128"], "precision.loss_scale"),  # static: DeepSpeed-only
        (["precision.hysteresis=4", "strategy=ddp", "launcher.nproc_per_node=2"], "precision.hysteresis"),
        (["precision.min_loss_scale=16", "strategy=fsdp"], "precision.min_loss_scale"),
    ],
)
def test_fp16_knobs_torch_cannot_honour_are_refused_outside_deepspeed(compose_cfg, overrides, key) -> None:
    cfg = compose_cfg("precision=fp16", *overrides)
    with pytest.raises(ConfigError) as err:
        check_before_load(cfg, Components.from_config(cfg), "cuda")
    assert err.value.key == key
    ds = compose_cfg("precision=fp16", *overrides, "strategy=zero2")  # DeepSpeed's fp16 block takes them
    check_before_load(ds, Components.from_config(ds), "cuda")


@pytest.mark.parametrize("strategy", ["zero2", "zero2_offload", "zero3_offload"])
@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_ppo_loop_optimizer_agrees_with_the_generated_config(compose_cfg, strategy: str, device: str) -> None:
    """accelerate refuses a torch optimizer beside a config ``optimizer`` block (DeepSpeed's CPU Adam under
    offload on GPU) and a DummyOptim without one: the loop's optimizer follows the config."""
    import torch
    from accelerate.utils import DummyOptim

    cfg = compose_cfg("recipe=ppo", f"strategy={strategy}")
    comps = Components.from_config(cfg)
    plan = batch_plan(cfg, comps, device)
    config = comps.strategy.deepspeed_config(plan, device)
    params = [torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2), requires_grad=False)]
    optimizer = comps.strategy.loop_optimizer(comps.optimizer, params, device, plan)
    uses_ds = "offload" in strategy and device == "cuda"
    assert ("optimizer" in config) is uses_ds is isinstance(optimizer, DummyOptim)
    if uses_ds:
        assert optimizer.lr == config["optimizer"]["params"]["lr"] and len(optimizer.params) == 1
        assert "optimizer" not in comps.strategy.inference_config(plan, device)
    else:
        assert isinstance(optimizer, torch.optim.AdamW) and config["zero_force_ds_cpu_optimizer"] is False


# ---- the interface: a narrow core, extensions a strategy opts into ------------------------------------
def public_members(cls: type) -> set[str]:
    return {name for name in vars(cls) if not name.startswith("_")}


def test_the_core_carries_no_extension_member() -> None:
    """What only model-splitting strategies or the loops we own need lives in ``ModelSplit`` / ``OwnLoop``,
    not as defaults on every ``Strategy``: the core and the extensions share no member, and the core stays
    narrow (it had 48 members when it carried both)."""
    from hydratune.components.strategy import ModelSplit, OwnLoop, Strategy

    core = public_members(Strategy) - {"device"}
    split, loop = public_members(ModelSplit), public_members(OwnLoop)
    assert not core & split and not core & loop and not split & loop, (core & split, core & loop)
    assert {"splits_sequences", "verify_built", "sequence_refusal", "model_load_kwargs"} <= split
    assert {"loop_accelerator", "prepare_loop", "verify_loop", "loop_refusal", "loop_engine"} <= loop
    assert len(core) <= 30, sorted(core)


def test_the_parallel_keys_are_declared_once() -> None:
    """Every option carries the same parallel keys (``ParallelKnobs``, read as one ``Parallel``); no engine
    declares a size of its own (the staged engine's preset default of 2 stages apart) and each says which
    axes it trains."""
    import dataclasses

    from hydratune.components.strategy import AXES, ParallelKnobs, training_options

    keys = {f.name for f in dataclasses.fields(ParallelKnobs)}
    for name, option in training_options().items():
        assert keys <= {f.name for f in dataclasses.fields(option)}, name
        own = keys & set(vars(type(option))) - ({"pp_size"} if name == "pipeline" else set())
        assert not own, f"{name} declares {own} again"
        assert option.axes <= set(AXES) and set(option.searched_axes) <= option.axes, name


def test_each_option_opts_into_the_extensions_it_uses() -> None:
    """Every option that trains answers ``model_split`` and ``loop_hooks``: a whole model per rank and no
    loop hooks unless it opts in; the recipe owning its loop is refused without them."""
    from hydratune.components.strategy import WHOLE, own_loop_refusal, training_options

    options = training_options()
    splits = {name for name, s in options.items() if s.model_split is not WHOLE}
    loops = {name for name, s in options.items() if s.loop_hooks is not None}
    assert splits == set(options) - {"single", "ddp"}
    assert loops == set(options) - {"pipeline"}
    for name in ("single", "ddp"):
        mesh = options[name].parallel.mesh(4)
        assert (mesh.dp, mesh.tp, mesh.sp, mesh.pp) == (4, 1, 1, 1)
        assert not options[name].model_split.splits_sequences
    ppo = SimpleNamespace(name="ppo")
    refusal = own_loop_refusal(options["pipeline"], ppo, "fp32")
    assert refusal is not None and refusal.key == "strategy" and "no hooks" in str(refusal)
    assert own_loop_refusal(options["ddp"], ppo, "fp32") is None


def test_an_axis_the_engine_does_not_train_is_refused_naming_options_that_do() -> None:
    """``strategy=ddp strategy.ep_size=2`` names ``strategy=zero0 strategy.ep_size=2`` (an option whose engine
    trains the axis and refuses none of it as shipped), never a ZeRO-3 option (AutoEP refuses stage 3), nor
    the ``+strategy.ep_size`` of an unknown key; a pipeline knob without stages is refused too."""
    from hydratune.components.strategy import DDP, DeepSpeed, Single, axis_refusal

    refusal = axis_refusal(DDP(ep_size=2))
    assert refusal is not None and refusal.key == "strategy.ep_size"
    assert refusal.hint.startswith("strategy=zero0 strategy.ep_size=2") and "zero3" not in refusal.hint
    assert axis_refusal(DeepSpeed(stage=1, ep_size=2)) is None
    refusal = axis_refusal(Single(pp_size=2))
    assert refusal is not None and refusal.hint.startswith("strategy=ddp strategy.pp_size=2")
    refusal = axis_refusal(DDP(schedule="gpipe"))
    assert refusal is not None and refusal.key == "strategy.schedule"
