"""``strategy=zero0``..``zero3pp``: DeepSpeed ZeRO, its config generated from the composed run (every
``"auto"`` resolved, see :meth:`DeepSpeed.deepspeed_config`), AutoTP / Ulysses / AutoEP for the ``tp`` /
``sp`` / ``ep`` axes; with pipeline stages (``pp``) the staged loop shards the stages as this stage says."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from hydratune.components.config.errors import ConfigError
from hydratune.components.config.ranges import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, Range, knob
from hydratune.components.config.registry import component
from hydratune.components.distributed import model_parallel
from hydratune.components.distributed.mesh import Mesh
from hydratune.components.memory.shapes import StrategyShape, elements
from hydratune.components.strategy import deepspeed_config as generated
from hydratune.components.strategy.core import (
    BatchPlan,
    ModelSplit,
    OwnLoop,
    PreparedLoop,
    Strategy,
    _mixed,
    knobs_refusal,
)

OFFLOAD = ("none", "cpu", "nvme")
COMM_DTYPES = (None, "fp32", "fp16", "bf16")
ZERO_CHECKPOINT = "__zero_checkpoint__"  # gather_state_dict's answer when the weights stay sharded on disk
TRAINED, FROZEN = "trained", "frozen"  # accelerate's DeepSpeed plugins of a loop we own (PPO)
AIO_KEYS = {"block_size", "queue_depth", "intra_op_parallelism", "single_submit", "overlap_events", "use_gds"}
#: AutoTP under ZeRO-3 through the HF Trainer matched one process (see docs/matrix.md); False refuses it
TP_ZERO3 = True


@component("strategy")
@dataclass(frozen=True)
class DeepSpeed(ModelSplit, OwnLoop, Strategy):
    """DeepSpeed ZeRO stage 0-3, with CPU/NVMe offload and ZeRO++ as options.

    Every knob below is a DeepSpeed config key; sizes left ``null`` are derived from the model's hidden
    size the way DeepSpeed's HF integration does (``hidden²`` buckets), never left as ``"auto"``.
    """

    stage: int = knob(2, Range(0, 3), hint="ZeRO stage 0, 1, 2 or 3")
    offload_optimizer: str = "none"  # none | cpu | nvme
    offload_param: str = "none"  # none | cpu | nvme (stage 3 only)
    pin_memory: bool = True
    # ZeRO-Infinity swap dir, required with NVMe offload (zero3_nvme): a fast local NVMe disk, not NFS
    # (e.g. /local_nvme)
    nvme_path: str | None = None
    overlap_comm: bool = True
    contiguous_gradients: bool = True
    reduce_scatter: bool = True
    reduce_bucket_size: float | None = knob(None, POSITIVE)  # elements; null = hidden²
    allgather_bucket_size: float | None = knob(None, POSITIVE)  # elements; null = hidden² (stages 1-2)
    stage3_prefetch_bucket_size: float | None = knob(None, NON_NEGATIVE)  # null = 0.9·hidden²
    stage3_param_persistence_threshold: float | None = knob(None, NON_NEGATIVE)  # null = 10·hidden
    stage3_max_live_parameters: float = knob(1e9, POSITIVE)
    stage3_max_reuse_distance: float = knob(1e9, NON_NEGATIVE)
    stage3_gather_16bit_weights_on_model_save: bool = True  # false: consolidate with zero_to_fp32
    sub_group_size: float = knob(1e9, POSITIVE)
    round_robin_gradients: bool = False
    communication_data_type: str | None = None  # fp32 | fp16 | bf16; null = the training dtype
    zero_quantized_weights: bool = False  # ZeRO++ qwZ
    zero_quantized_gradients: bool = False  # ZeRO++ qgZ
    # ZeRO++ hpZ: secondary partition size; null = GPUs per node (launcher.nproc_per_node)
    zero_hpz_partition_size: int | None = knob(1, AT_LEAST_ONE)
    # NVMe param swap buffer (elements); null = largest shard
    offload_param_buffer_size: float | None = knob(None, POSITIVE)
    optimizer_impl: str = "auto"  # auto | torch | deepspeed (DeepSpeed's CPU Adam under offload)
    aio: dict[str, Any] = field(
        default_factory=lambda: {
            "block_size": 1048576,
            "queue_depth": 8,
            "intra_op_parallelism": 1,
            "single_submit": False,
            "overlap_events": True,
        }
    )

    def validate(self) -> None:
        super().validate()
        for key in ("offload_optimizer", "offload_param"):
            if getattr(self, key) not in OFFLOAD:
                raise ConfigError(
                    f"unknown offload target '{getattr(self, key)}'",
                    key=f"strategy.{key}",
                    hint=f"one of {OFFLOAD}",
                )
        if self.offload_optimizer != "none" and self.stage == 0:
            raise ConfigError(
                "optimizer offload needs ZeRO stage >= 1",
                key="strategy.offload_optimizer",
                hint="use zero2_offload",
            )
        if self.offload_param != "none" and self.stage != 3:
            raise ConfigError(
                "parameter offload needs ZeRO stage 3", key="strategy.offload_param", hint="use zero3_offload"
            )
        if "nvme" in (self.offload_optimizer, self.offload_param) and not self.nvme_path:
            raise ConfigError(
                "NVMe offload needs a swap directory",
                key="strategy.nvme_path",
                hint="strategy.nvme_path=/local_nvme (a fast local disk, not NFS)",
            )
        if self.communication_data_type not in COMM_DTYPES:
            raise ConfigError(
                f"unknown '{self.communication_data_type}'",
                key="strategy.communication_data_type",
                hint="fp32, fp16, bf16 or null",
            )
        if self.zeropp and self.stage != 3:
            raise ConfigError("ZeRO++ (qwZ / qgZ / hpZ) needs ZeRO stage 3", key="strategy.stage")
        unknown = set(self.aio) - AIO_KEYS
        if unknown:
            raise ConfigError(
                f"unknown DeepSpeed aio key(s) {sorted(unknown)} (DeepSpeed would ignore them)",
                key=f"strategy.aio.{sorted(unknown)[0]}",
                hint=f"known: {sorted(AIO_KEYS)} (thread_count is now intra_op_parallelism)",
            )
        if self.optimizer_impl not in ("auto", "torch", "deepspeed"):
            raise ConfigError(
                f"unknown '{self.optimizer_impl}'",
                key="strategy.optimizer_impl",
                hint="auto, torch or deepspeed",
            )

    #: AutoTP, Ulysses, AutoEP; pipeline stages through the staged loop (:attr:`stage_sharding`)
    axes: ClassVar[frozenset[str]] = frozenset({"tp", "sp", "pp", "ep"})
    searched_axes: ClassVar[tuple[str, ...]] = ("tp", "sp", "ep")
    needs_process_group: ClassVar[bool] = True
    wraps_model: ClassVar[bool] = True
    scales_loss: ClassVar[bool] = True
    loop_engine: ClassVar[bool] = True

    @property
    def shards_parameters(self) -> bool:  # type: ignore[override]
        return self.stage == 3 or self.tp_size > 1

    @property
    def generates_together(self) -> bool:
        return self.tp_size > 1 or self.ep_size > 1  # a split layer's forward is collective

    @property
    def partitions_at_load(self) -> bool:  # type: ignore[override]
        return self.stage == 3

    @property
    def label(self) -> str:
        split = f", AutoTP {self.tp_size}" if self.tp_size > 1 else ""
        split += f", Ulysses SP {self.sp_size}" if self.sp_size > 1 else ""
        split += f", AutoEP {self.ep_size}" if self.ep_size > 1 else ""
        return f"DeepSpeed (ZeRO-{self.stage}{split})"

    @property
    def zeropp(self) -> bool:
        """ZeRO++: quantized weights or gradients (qwZ, qgZ), or a hierarchical partition (hpZ)."""
        hpz = self.zero_hpz_partition_size
        return self.zero_quantized_weights or self.zero_quantized_gradients or hpz is None or hpz > 1

    def applicable(self, world_size: int) -> bool:
        return world_size > 1 or not self.zeropp  # ZeRO++ cuts traffic between ranks: none on one

    def memory_shape(self, gpus_per_node: int = 8) -> StrategyShape:
        hpz = self.zero_hpz_partition_size or (gpus_per_node if self.stage == 3 else 1)  # null: the node
        return StrategyShape(
            "deepspeed",
            stage=self.stage,
            offload_optimizer=self.offload_optimizer,
            offload_param=self.offload_param,
            reduce_bucket_size=elements(self.reduce_bucket_size),
            allgather_bucket_size=elements(self.allgather_bucket_size),
            prefetch_bucket_size=elements(self.stage3_prefetch_bucket_size),
            max_live_parameters=elements(self.stage3_max_live_parameters) or 1e9,
            overlap_comm=self.overlap_comm,
            quantized_weights=self.zero_quantized_weights,
            hpz_partition_size=int(hpz),
            sub_group_size=elements(self.sub_group_size) or 1e9,
        )

    def required_knobs(self) -> dict[str, str]:
        nvme = "nvme" in (self.offload_optimizer, self.offload_param)
        return {"strategy.nvme_path": "/local_nvme"} if nvme and not self.nvme_path else {}

    def device_refusal(self, device: str, dtype: str, owns_loop: bool) -> ConfigError | None:
        if device == "cuda":
            return None
        if dtype != "fp32":
            return ConfigError(
                "DeepSpeed on CPU trains in fp32 only (no bf16/fp16 engine on CPU)",
                key="precision",
                hint="precision=fp32 on CPU, or run on GPUs",
            )
        for key in ("zero_quantized_weights", "zero_quantized_gradients"):
            if getattr(self, key):
                return ConfigError(
                    f"ZeRO++ {key} needs DeepSpeed's CUDA quantizer kernels (no {device} implementation)",
                    key=f"strategy.{key}",
                    hint="run zero3pp on GPUs, or strategy=zero3 on this host",
                )
        return None

    def loop_refusal(self, dtype: str) -> ConfigError | None:
        if self.stage == 3 and not self.stage3_gather_16bit_weights_on_model_save:
            return ConfigError(
                "a loop we own (recipe=ppo) under ZeRO-3 gathers the final weights on rank 0",
                key="strategy.stage3_gather_16bit_weights_on_model_save",
                hint="leave it true",
            )
        return None

    @property
    def stage_sharding(self) -> int | None:
        """ZeRO-1: the stages' optimizer states sharded over the replicas; ZeRO-2 / 3: FSDP2 on each stage."""
        return self.stage

    def axis_refusal(self, device: str | None = None, dtype: str | None = None) -> ConfigError | None:
        """With pipeline stages the staged loop shards the stages itself (:attr:`stage_sharding`): none of
        DeepSpeed's offload or ZeRO++ knobs. AutoEP is verified with ZeRO 0-2 and no TP / SP. AutoTP /
        Ulysses are not run with offload or ZeRO++ (not measured with a split model); ZeRO-3 with tensor
        parallel only when ``TP_ZERO3`` (measured equal to ZeRO-3 on one process); Ulysses under ZeRO-3 not
        (measured different, whichever ``reduce_scatter``)."""
        p = self.parallel
        if p.pp > 1:
            knobs = {
                "offload_optimizer": self.offload_optimizer != "none",
                "offload_param": self.offload_param != "none",
                "zero_quantized_weights": self.zero_quantized_weights,
                "zero_quantized_gradients": self.zero_quantized_gradients,
                "zero_hpz_partition_size": (self.zero_hpz_partition_size or 1) > 1,
            }
            return knobs_refusal(
                self,
                knobs,
                f"pipeline stages (strategy.pp_size={p.pp}) train through the pipeline loop, whose "
                "data-parallel side shards with ZeRO-1 (ZeroRedundancyOptimizer) or FSDP2 (ZeRO-2/3) and",
                f"strategy=zero{self.stage} strategy.pp_size={p.pp} with {{key}} left at its default, or "
                "drop strategy.pp_size",
            )
        if p.ep > 1 and (self.stage == 3 or p.tp > 1 or p.sp > 1):
            return ConfigError(
                f"expert parallel (AutoEP, ep_size={p.ep}) runs here with ZeRO stage 0-2 and no tensor or "
                "sequence parallel (verified against one process only there)",
                key="strategy.stage" if self.stage == 3 else "strategy.ep_size",
                hint="strategy=zero1 or zero2 with strategy.ep_size, and tp_size=1, sp_size=1",
            )
        return self.split_refusal()

    def split_refusal(self) -> ConfigError | None:
        """What AutoTP / Ulysses (``tp`` / ``sp`` above 1) are not run with here (None: nothing asked)."""
        p = self.parallel
        if p.tp == 1 and p.sp == 1:
            return None
        knob = "strategy.tp_size" if p.tp > 1 else "strategy.sp_size"
        what = "tensor parallel (AutoTP)" if p.tp > 1 else "sequence parallel (Ulysses)"
        if self.offload_optimizer != "none" or self.offload_param != "none":
            return ConfigError(
                f"{what} with ZeRO offload is not supported here (not verified against one process)",
                key="strategy.offload_optimizer"
                if self.offload_optimizer != "none"
                else "strategy.offload_param",
                hint=f"strategy=zero1 / zero2 / zero3 {knob}=..., or drop {knob}",
            )
        if self.zeropp:
            return ConfigError(
                f"{what} with ZeRO++ is not supported here", key=knob, hint=f"strategy=zero3 {knob}=..."
            )
        if self.stage == 3 and p.tp > 1 and not TP_ZERO3:
            return ConfigError(
                "tensor parallel (AutoTP) under ZeRO-3 is not supported here",
                key="strategy.stage",
                hint="strategy=zero1 or zero2 with strategy.tp_size (the optimizer state is sharded over the "
                "data-parallel replicas)",
            )
        if self.stage == 3 and p.sp > 1:
            return ConfigError(
                "sequence parallel (Ulysses) under ZeRO-3 does not train like one process through the HF "
                "Trainer: measured with SGD, the step-2 loss 5.6829 (reduce_scatter=true) or 5.7046 (false) "
                "against 5.5573 for ZeRO-3 on one process, and another gradient norm from step 1",
                key="strategy.stage",
                hint="strategy=zero1 or zero2 with strategy.sp_size (ZeRO-2 shards gradients and optimizer "
                "states over all ranks of the group)",
            )
        return None

    def sequence_refusal(self, attention: str, packed: bool) -> ConfigError | None:
        """Ulysses gathers each layer's queries, keys and values over the SP group and calls the model's own
        attention on the whole sequence with the mask dropped and the position ids gathered: eager (a dense
        mask) is refused by DeepSpeed; packed rows keep their documents apart only with an attention that
        reads the position ids (varlen_sdpa, FlashAttention); sdpa / flex would attend across them."""
        if attention == "eager":
            return ConfigError(
                "sequence parallel (Ulysses) cannot wrap eager attention (it needs a dense [tokens, "
                "tokens] mask)",
                key="model.attn_implementation",
                hint="model.attn_implementation=auto (or sdpa / flash_attention_2)",
            )
        if packed and attention not in ("varlen_sdpa", "flash_attention_2", "flash_attention_3"):
            return ConfigError(
                f"sequence parallel with data.packing=true and {attention} attention: Ulysses drops the "
                f"mask, so {attention} would attend across the documents packed into a row",
                key="data.packing",
                hint="model.attn_implementation=auto (varlen_sdpa keeps documents apart by their position "
                "ids), or data.packing=false",
            )
        return None

    def check(self, plan: BatchPlan, device: str) -> None:
        """DeepSpeed installed; ZeRO++ hpZ's secondary partition tiles the world (whole groups of ranks)."""
        import importlib.util

        if importlib.util.find_spec("deepspeed") is None:
            raise ConfigError(
                f"strategy {self.label} needs deepspeed, which is not installed",
                key="strategy",
                hint="pip install 'hydratune[deepspeed]'",
            )
        hpz = generated.hpz_partition_size(self, plan)
        if hpz > 1 and plan.world_size % hpz:
            raise ConfigError(
                f"ZeRO++ hpZ partition size {hpz} does not divide the {plan.world_size} process(es)",
                key="strategy.zero_hpz_partition_size",
                hint="null (= launcher.nproc_per_node, the GPUs per node) or a divisor of the world size",
            )

    def deepspeed_config(self, plan: BatchPlan, device: str = "cuda") -> dict[str, Any]:
        """The full DeepSpeed config for this run, no ``"auto"`` anywhere (``deepspeed_config.py``)."""
        return generated.deepspeed_config(self, plan, device)

    def inference_config(self, plan: BatchPlan, device: str = "cuda") -> dict[str, Any]:
        """The config of frozen models' engines (``deepspeed_config.py``)."""
        return generated.inference_config(self, plan, device)

    def uses_deepspeed_optimizer(self, device: str, optimizer: Any) -> bool:
        """DeepSpeed's own Adam rather than the torch optimizer (``deepspeed_config.py``)."""
        return generated.uses_deepspeed_optimizer(self, device, optimizer)

    def training_args(self, device: str, plan: BatchPlan | None = None) -> dict[str, Any]:
        if plan is None:
            raise ValueError("DeepSpeed.training_args needs the run's BatchPlan")
        # DeepSpeed on a CPU host runs over gloo with use_cpu + no autocast flags; see platform notes.
        args = {**super().training_args(device, plan), "deepspeed": self.deepspeed_config(plan, device)}
        if self.sp_size > 1:
            args["parallelism_config"] = model_parallel.ulysses_config(
                self.sp_size, plan.data_parallel_size, plan.attention
            )
            # on resume the Trainer's batch skip cannot take Ulysses' data loader: runtime/callbacks.py's
            # ResumeSplitRows fast-forwards it instead
            args["ignore_data_skip"] = True
        return args

    def expected_distributed_types(self, world_size: int) -> set[str]:
        return {"DEEPSPEED"}

    def before_model_load(self, ctx: Any) -> Any:
        """Under ZeRO-3, register the config with transformers first, so ``from_pretrained`` /
        ``from_config`` build the model inside ``deepspeed.zero.Init``: each rank then materialises
        only its shard instead of a full copy in host RAM. Returns the registered config: transformers
        keeps only a weak reference, so the run holds it while it trains. Ulysses (and ZeRO-3) make their
        process groups through DeepSpeed's comm layer, which is brought up here first."""
        if self.ep_size > 1:
            model_parallel.autoep_transformers_compat()
        if self.stage != 3 and self.sp_size == 1:
            return None
        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo" if ctx.device == "cpu" else None)
        if self.stage != 3:
            return None
        from transformers.integrations import HfDeepSpeedConfig

        return HfDeepSpeedConfig(self.deepspeed_config(ctx.plan, ctx.device))

    def files(self, plan: BatchPlan, device: str) -> dict[str, Any]:
        return {"deepspeed.json": self.deepspeed_config(plan, device)}

    def loop_accelerator(self, device: str, plan: BatchPlan) -> Any:
        """accelerate with this DeepSpeed config. On CPU the process state is made first with ``cpu=True``:
        ``Accelerator(cpu=True, deepspeed_plugin=…)`` would silently drop DeepSpeed."""
        from accelerate import Accelerator, PartialState
        from accelerate.utils import DeepSpeedPlugin

        if device == "cpu":
            PartialState(cpu=True)
        plugins = {TRAINED: DeepSpeedPlugin(hf_ds_config=self.deepspeed_config(plan, device))}
        if self.stage == 3:  # frozen models get their own engine (the first plugin is the active one)
            plugins[FROZEN] = DeepSpeedPlugin(hf_ds_config=self.inference_config(plan, device))
        return Accelerator(deepspeed_plugins=plugins, mixed_precision=_mixed(plan.dtype))

    def loop_optimizer(self, optimizer: Any, params: list[Any], device: str, plan: BatchPlan) -> Any:
        """When the generated config has an ``optimizer`` block (DeepSpeed's CPU Adam under offload on GPU),
        accelerate refuses a torch optimizer next to it: a ``DummyOptim`` then hands DeepSpeed the
        parameters and it builds its own from the block; else the torch optimizer (offload accepts it:
        ``zero_force_ds_cpu_optimizer`` is false)."""
        if not self.uses_deepspeed_optimizer(device, optimizer):
            return super().loop_optimizer(optimizer, params, device, plan)
        from accelerate.utils import DummyOptim

        trained = [p for p in params if p.requires_grad]
        return DummyOptim(trained, lr=float(optimizer.lr), weight_decay=float(optimizer.weight_decay))

    def prepare_loop(
        self,
        accelerator: Any,
        modules: dict[str, Any],
        optimizer: Any,
        combine: Callable[[dict[str, Any]], Any],
    ) -> PreparedLoop:
        """DeepSpeed's engine wraps exactly one model: the ``combine``d modules (whose attributes are the
        modules' names) become one engine, which scales, accumulates, clips and steps by itself."""
        engine, optimizer = accelerator.prepare(combine(modules), optimizer)
        return PreparedLoop({name: getattr(engine.module, name) for name in modules}, optimizer, engine)

    def prepare_frozen(self, accelerator: Any, build: Callable[[], Any]) -> Any:
        """ZeRO-3: ``build()`` runs with the inference config live (``from_pretrained`` then shards the
        weights as it loads them) and the model becomes a DeepSpeed inference engine (no optimizer);
        stages 0-2 keep a whole copy per process."""
        if self.stage != 3:
            return super().prepare_frozen(accelerator, build)
        accelerator.state.select_deepspeed_plugin(FROZEN)
        try:
            model = build().eval().requires_grad_(False)
            engine = accelerator.prepare(model)
        finally:
            accelerator.state.select_deepspeed_plugin(TRAINED)
        engine.eval()  # DeepSpeed's train()/eval() return None
        return engine

    def gather_state_dict(self, trainer: Any) -> dict[str, Any] | None:
        """ZeRO-3: the 16-bit weights gathered on rank 0, or, with gathering turned off, a DeepSpeed
        checkpoint in ``final_zero/`` to consolidate offline (see ``ZERO_CHECKPOINT``). Tensor parallel:
        the shards gathered into whole weights (in the training dtype). Expert parallel: every rank's experts
        gathered back into the model's own parameters (``model_parallel.full_expert_state_dict``)."""
        if self.tp_size > 1:
            return trainer.accelerator.get_state_dict(trainer.model_wrapped)
        if self.ep_size > 1:
            return model_parallel.full_expert_state_dict(trainer.model_wrapped.module)
        if self.stage != 3:
            return None
        if self.stage3_gather_16bit_weights_on_model_save:
            return trainer.accelerator.get_state_dict(trainer.model_wrapped)
        from pathlib import Path

        out = Path(trainer.args.output_dir).parent / "final_zero"
        trainer.model_wrapped.save_checkpoint(str(out))  # every rank writes its shard
        return {ZERO_CHECKPOINT: str(out)}

    def describe(self, plan: BatchPlan, device: str = "cuda") -> dict[str, Any]:
        described = super().describe(plan, device)
        if self.tp_size * self.sp_size > 1:
            described["batch"]["deepspeed train_batch_size"] = (
                "left out: DeepSpeed derives it from its own process groups (micro x accumulation x ranks)"
            )
        return {**described, "deepspeed.json": self.deepspeed_config(plan, device)}

    def verify(self, accelerator: Any, world_size: int | None = None) -> None:
        super().verify(accelerator, world_size)
        plugin = accelerator.state.deepspeed_plugin
        stage = plugin.zero_stage if plugin is not None else None
        if stage != self.stage:
            raise ConfigError(
                f"asked for ZeRO stage {self.stage} but DeepSpeed runs stage {stage}",
                key="strategy.stage",
                hint="a stale ACCELERATE_DEEPSPEED_* variable or accelerate config file may override it",
            )
        config = getattr(accelerator, "parallelism_config", None)
        live_sp = config.sp_size if config is not None and config.sp_backend == "deepspeed" else 1
        if live_sp != self.sp_size:
            raise ConfigError(
                f"asked for sequence parallel over {self.sp_size} ranks but accelerate set up {live_sp}",
                key="strategy.sp_size",
                hint="a stale PARALLELISM_CONFIG_* variable may override it",
            )

    def verify_built(self, model: Any, mesh: Mesh) -> dict[str, Any]:
        """The TP / SP groups DeepSpeed made and this rank's shards (``model_parallel.deepspeed_layout``);
        with expert parallel, the experts this rank holds (``model_parallel.expert_layout``)."""
        if mesh.ep > 1:
            return {"experts": model_parallel.expert_layout(model)}
        if mesh.is_data_parallel_only:
            return {}
        return model_parallel.deepspeed_layout(model, mesh)


def partition_at_load(model: Any) -> dict[str, Any]:
    """How a model built under ZeRO-3's ``zero.Init`` is held right after the build: each parameter a
    DeepSpeed partition (empty local tensor, the shard in ``ds_tensor``); the share of elements this rank
    holds (about 1/world, padding aside). A model built whole would show 0 partitioned tensors here."""
    params = list(model.parameters())
    parted = [p for p in params if hasattr(p, "ds_tensor")]
    total = sum(int(p.ds_numel) for p in parted)
    local = sum(int(p.ds_tensor.numel()) for p in parted)
    return {
        "partitioned tensors": f"{len(parted)} of {len(params)}",
        "elements held whole": sum(p.numel() for p in params) - sum(p.numel() for p in parted),
        "this rank's share": round(local / total, 4) if total else 0.0,
    }


def validate_deepspeed_config(config: dict[str, Any]) -> None:
    """Check ``config`` with DeepSpeed's own config class (when deepspeed is installed)."""
    try:
        from deepspeed.runtime.config import DeepSpeedConfig
    except ImportError:
        return
    import torch.distributed as dist

    checked = dict(config)
    if not (dist.is_available() and dist.is_initialized()):  # DeepSpeed then assumes one process
        checked["train_batch_size"] = (
            config["train_micro_batch_size_per_gpu"] * config["gradient_accumulation_steps"]
        )
    try:
        DeepSpeedConfig(checked)
    except Exception as err:  # DeepSpeed raises assorted types for bad configs
        raise ConfigError(f"DeepSpeed rejected the generated config: {err}", key="strategy") from err
