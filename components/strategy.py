"""Strategy component: how training is spread over devices.

``single`` and ``ddp`` are plain accelerate; ``zero0``…``zero3pp`` generate a DeepSpeed config from the
composed run (every ``"auto"`` resolved, see :meth:`DeepSpeed.deepspeed_config`); ``fsdp`` gives
accelerate an FSDP2 plugin, and shards the modules of loops we own (PPO) with ``fully_shard`` itself
(``components/distributed/fsdp.py``). After the trainer is built, :meth:`Strategy.verify` checks that
accelerate really prepared what was asked for (it falls back silently in several setups) and refuses to train
otherwise; loops are checked by :meth:`Strategy.verify_loop`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from components.config.errors import ConfigError
from components.config.registry import component
from components.distributed import model_parallel
from components.distributed.mesh import Mesh
from components.memory.parallel import SCHEDULES
from components.memory.shapes import SINGLE, StrategyShape, elements

DEVICES = ("auto", "cpu", "cuda", "mps")
OFFLOAD = ("none", "cpu", "nvme")
COMM_DTYPES = (None, "fp32", "fp16", "bf16")
STATE_DICT_TYPES = ("FULL_STATE_DICT", "SHARDED_STATE_DICT")
ZERO_CHECKPOINT = "__zero_checkpoint__"  # gather_state_dict's answer when the weights stay sharded on disk
TRAINED, FROZEN = "trained", "frozen"  # accelerate's DeepSpeed plugins of a loop we own (PPO)
AIO_KEYS = {"block_size", "queue_depth", "intra_op_parallelism", "single_submit", "overlap_events", "use_gds"}
MULTI_PROCESS = {"MULTI_GPU", "MULTI_CPU", "MULTI_MPS", "MULTI_XPU"}  # plain multi-process (DDP) types
#: AutoTP under ZeRO-3 through the HF Trainer matched one process (see docs/matrix.md); False refuses it
TP_ZERO3 = True


def detect_device(requested: str = "auto") -> str:
    """'cuda', 'mps' or 'cpu': the requested one, or the best one present."""
    import torch

    if requested != "auto":
        if requested == "cuda" and not torch.cuda.is_available():
            raise ConfigError(
                "CUDA was requested but no GPU is visible", key="strategy.device", hint="use auto"
            )
        return requested
    if torch.cuda.is_available():
        return "cuda"
    if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        return "mps"
    return "cpu"


@dataclass(frozen=True)
class BatchPlan:
    """What a strategy needs to know about the run, resolved once, so DeepSpeed and the trainer agree."""

    micro_batch_size: int
    gradient_accumulation_steps: int
    world_size: int
    max_grad_norm: float
    dtype: str  # resolved precision: fp32 | bf16 | fp16
    precision: Any = None  # the precision component (fp16 loss-scaling knobs)
    optimizer: Any = None  # the optimizer component (DeepSpeed's own optimizer under offload)
    hidden_size: int | None = None  # sizes the ZeRO buckets; None = DeepSpeed's defaults
    largest_param: int | None = None  # elements of the biggest weight (vocab x hidden): NVMe swap buffers
    gpus_per_node: int = 1  # processes per node: ZeRO++ hpZ's default secondary partition
    mesh: Mesh | None = None  # the strategy's split of world_size (None: data parallel only)
    attention: str | None = None  # the model's resolved attn implementation (Ulysses wraps it)
    architecture: Any = None  # the model's config (None: not readable here): the pipeline's stage split

    @property
    def data_parallel_size(self) -> int:
        """Replicas that each see their own micro-batches: world / (tp x sp x pp)."""
        return self.mesh.dp if self.mesh is not None else self.world_size

    @property
    def global_batch_size(self) -> int:
        return self.micro_batch_size * self.gradient_accumulation_steps * self.data_parallel_size


def _mixed(dtype: str) -> str:
    return "no" if dtype == "fp32" else dtype


@dataclass
class PreparedLoop:
    """The trained modules of a loop we own after :meth:`Strategy.prepare_loop`, as the loop calls them, and
    its optimizer; ``engine``: the one DeepSpeed engine around all of them (it scales, accumulates, clips
    and steps by itself), else None."""

    modules: dict[str, Any]
    optimizer: Any
    engine: Any = None


def first_refusal(rules: dict[str, tuple[bool, str, str]]) -> ConfigError | None:
    """The ConfigError of the first rule that applies (``{key: (applies, message, hint)}``), or None."""
    for key, (applies, message, hint) in rules.items():
        if applies:
            return ConfigError(message, key=key, hint=hint)
    return None


def live_type(accelerator: Any) -> str:
    """accelerate's DistributedType name ('NO', 'MULTI_CPU', 'DEEPSPEED', 'FSDP', …)."""
    return str(accelerator.distributed_type).rsplit(".", 1)[-1]


@dataclass(frozen=True)
class Strategy:
    """Base of every strategy: where it runs, what it adds to TrainingArguments, what it must produce, and
    what the rest of hydratune may ask of it (the class variables and the methods below) instead of its
    class."""

    device: str = "auto"

    #: parameters live sharded across ranks (ZeRO-3, FSDP): saving needs a gather, generation all ranks
    shards_parameters: ClassVar[bool] = False
    #: needs torch.distributed set up even for a single process (DeepSpeed, FSDP)
    needs_process_group: ClassVar[bool] = False
    #: the model is built already partitioned over ranks (ZeRO-3's zero.Init): no copy of it can be made
    partitions_at_load: ClassVar[bool] = False
    #: the model goes into an engine or a sharding wrapper (DeepSpeed, FSDP): recipes that run a plain model
    #: per process (generate, best_of_n, eval) cannot use it
    wraps_model: ClassVar[bool] = False
    #: at most this many processes (None: any number)
    max_processes: ClassVar[int | None] = None
    #: does its own fp16 loss scaling (DeepSpeed's config block): torch's GradScaler and its knobs are unused
    scales_loss: ClassVar[bool] = False
    #: each sharded module holds one dtype (FSDP2): a frozen base cannot load in bf16 beside fp32 adapters
    one_dtype_per_shard: ClassVar[bool] = False
    #: a loop we own trains one engine that scales, accumulates, clips and steps by itself (DeepSpeed)
    loop_engine: ClassVar[bool] = False
    #: the model is built whole, then cut into pipeline stages, one part per rank: a recipe trains through
    #: the pipeline's own loop (``components/runtime/pipeline.py``) when it declares ``trains_in_stages``
    splits_layers: ClassVar[bool] = False
    #: the mesh dimensions ("tp", "sp", "pp") this option splits the model along, each set by its
    #: ``strategy.<dim>_size`` knob and read back through :meth:`mesh`: strategy=auto tries their sizes
    parallel_dims: ClassVar[tuple[str, ...]] = ()
    #: tensor / sequence parallel ranks: knobs (``strategy.tp_size``, ``strategy.sp_size``) of the strategies
    #: whose engines split the model that way (DeepSpeed, FSDP); 1 elsewhere
    tp_size: ClassVar[int] = 1
    sp_size: ClassVar[int] = 1

    @property
    def label(self) -> str:
        """How the summary names this strategy."""
        return type(self).__name__

    def applicable(self, world_size: int) -> bool:
        """Whether this option makes sense for ``world_size`` ranks (the estimate's table, auto's ladder)."""
        return True

    def memory_shape(self, gpus_per_node: int = 8) -> StrategyShape:
        """What this strategy does to memory (``components/memory/estimate.py`` reads only this)."""
        return SINGLE

    def mesh(self, world_size: int) -> Mesh:
        """How ``world_size`` processes split into dp x tp x sp x pp under this strategy (data parallel only
        unless a strategy says otherwise)."""
        return Mesh(world_size, tp=self.tp_size, sp=self.sp_size)

    @property
    def splits_sequences(self) -> bool:
        """Each micro-batch's tokens are split over ranks (Ulysses SP, context parallel): rows must keep a
        ``[micro_batch, tokens]`` shape whose token count the ranks divide."""
        return self.sp_size > 1

    @property
    def generates_together(self) -> bool:
        """Every rank takes part in each ``generate()`` (tensor-parallel layers all-reduce inside forward):
        the eval generations run on all ranks at once, rank 0 records them."""
        return False

    def model_load_kwargs(self, plan: BatchPlan) -> dict[str, Any]:
        """What ``from_pretrained`` gets from the strategy (FSDP x TP: ``DistributedConfig``)."""
        return {}

    def split_refusal(self, device: str, dtype: str) -> ConfigError | None:
        """What this strategy's engines cannot do with its ``tp_size`` / ``sp_size`` on ``device`` and with
        its other knobs (None: they can). The model's own numbers are checked by ``mesh.check_model``."""
        return None

    def sequence_refusal(self, attention: str, packed: bool) -> ConfigError | None:
        """Why this strategy's sequence split cannot run the model's ``attention`` implementation, on rows
        holding several documents when ``packed`` (None: it can)."""
        return None

    def verify_built(self, model: Any, mesh: Mesh) -> dict[str, Any]:
        """Once the trainer has built its engine (the first thing ``train()`` does): what it really built of
        ``mesh`` (process groups, this rank's shards), for the report; a ConfigError on any mismatch. {}:
        nothing split, nothing to check beyond :meth:`verify`."""
        return {}

    def required_knobs(self) -> dict[str, str]:
        """Knobs this option cannot go without (left null in its YAML), each with an example value."""
        return {}

    def device_refusal(self, device: str, dtype: str, owns_loop: bool) -> ConfigError | None:
        """Why this strategy cannot train on ``device`` in ``dtype`` (None: it can). ``owns_loop``: the
        recipe runs its own loop through the loop hooks below (PPO) rather than a Trainer."""
        return None

    def loop_refusal(self, dtype: str) -> ConfigError | None:
        """What the loop hooks below cannot do with this option's knobs in ``dtype`` (None: nothing)."""
        return None

    def combination_refusal(
        self, recipe: Any, peft: Any, quantization: Any, dtype: str, data: Any = None, model: Any = None
    ) -> ConfigError | None:
        """Why this strategy cannot train ``recipe`` (its class: the declared capabilities) with this adapter,
        quantization, dtype, data and model (None: it can). The pre-load checks and the support matrix
        (which has no data or model) ask it."""
        return None

    def check(self, plan: BatchPlan, device: str) -> None:
        """This strategy's own checks of the run before any model loads (packages, process layout)."""

    def validate(self) -> None:
        if self.device not in DEVICES:
            raise ConfigError(
                f"unknown device '{self.device}'", key="strategy.device", hint=f"one of {DEVICES}"
            )

    def resolve_device(self) -> str:
        return detect_device(self.device)

    def training_args(self, device: str, plan: BatchPlan | None = None) -> dict[str, Any]:
        return {"use_cpu": device == "cpu"}

    def expected_distributed_types(self, world_size: int) -> set[str]:
        """accelerate DistributedType names this strategy may legitimately end up with."""
        return {"NO"}

    def before_model_load(self, ctx: Any) -> Any:
        """Runs right before the model is built (ZeRO-3 makes its config live here); returns what the run
        must keep alive while it trains (None: nothing)."""
        return None

    def loop_accelerator(self, device: str, plan: BatchPlan) -> Any:
        """An ``Accelerator`` for recipes that own their loop (PPO), set up as this strategy asks."""
        from accelerate import Accelerator

        handlers = plan.precision.scaler_handlers(plan.dtype) if plan.precision is not None else []
        return Accelerator(mixed_precision=_mixed(plan.dtype), cpu=device == "cpu", kwargs_handlers=handlers)

    def loop_optimizer(self, optimizer: Any, params: list[Any], device: str, plan: BatchPlan) -> Any:
        """The optimizer of a loop we own, before ``prepare_loop``: the optimizer component's torch one."""
        return optimizer.build(params, device)

    def prepare_frozen(self, accelerator: Any, build: Callable[[], Any]) -> Any:
        """A frozen model of a loop we own (PPO's reference, a reward model), made by ``build()`` and made
        ready for inference: here a whole copy on each process's device."""
        return build().to(accelerator.device).eval().requires_grad_(False)

    def shard_trained(self, accelerator: Any, module: Any) -> Any:
        """A trained module of a loop we own, before its optimizer is built: as it is here (FSDP shards
        it; DeepSpeed and DDP wrap it in :meth:`prepare_loop`)."""
        return module

    def prepare_loop(
        self,
        accelerator: Any,
        modules: dict[str, Any],
        optimizer: Any,
        combine: Callable[[dict[str, Any]], Any],
    ) -> PreparedLoop:
        """The trained ``modules`` and ``optimizer`` of a loop we own, through ``accelerator.prepare`` (the
        loop steps its schedule itself: a prepared one would step once per process). ``combine`` makes one
        module of them, for strategies that wrap exactly one (DeepSpeed)."""
        *prepared, optimizer = accelerator.prepare(*modules.values(), optimizer)
        return PreparedLoop(dict(zip(modules, prepared, strict=True)), optimizer)

    def generation(self, module: Any) -> contextlib.AbstractContextManager[None]:
        """Around sampling from a trained module of a loop we own (FSDP keeps the layers gathered)."""
        return contextlib.nullcontext()

    def gather_loop_weights(self, accelerator: Any, module: Any) -> dict[str, Any] | None:
        """The full state dict of a loop's trained ``module`` (DeepSpeed: its engine) when parameters are
        sharded, on rank 0 (a collective call on every rank); None when each rank holds whole weights."""
        if not self.shards_parameters:
            return None
        return accelerator.get_state_dict(module)

    def gather_state_dict(self, trainer: Any) -> dict[str, Any] | None:
        """The full state dict for saving (a collective call on every rank) when parameters are sharded;
        None when each rank holds whole weights."""
        if not self.shards_parameters:
            return None
        return trainer.accelerator.get_state_dict(trainer.model_wrapped)

    def live_description(self, accelerator: Any) -> str:
        """What accelerate actually prepared: distributed type, ZeRO stage, processes."""
        plugin = getattr(accelerator.state, "deepspeed_plugin", None)
        stage = f", ZeRO stage {plugin.zero_stage}" if plugin is not None else ""
        return f"{live_type(accelerator)}{stage}, {accelerator.num_processes} process(es)"

    def files(self, plan: BatchPlan, device: str) -> dict[str, Any]:
        """Generated settings written into the run dir (e.g. ``deepspeed.json``)."""
        return {}

    def describe(self, plan: BatchPlan, device: str = "cuda") -> dict[str, Any]:
        """What ``mode=plan`` prints besides the config: the mesh, the batch arithmetic and generated
        settings."""
        split = plan.mesh is not None and not plan.mesh.is_data_parallel_only
        batch: dict[str, Any] = {
            "micro_batch_size": plan.micro_batch_size,
            "gradient_accumulation_steps": plan.gradient_accumulation_steps,
            "world_size": plan.world_size,
            "global_batch_size": f"{plan.micro_batch_size} x {plan.gradient_accumulation_steps} x "
            f"{plan.data_parallel_size}{' data-parallel replicas' if split else ''} "
            f"= {plan.global_batch_size}",
        }
        if plan.mesh is None or plan.mesh.is_data_parallel_only:
            return {"batch": batch}
        mesh = plan.mesh
        if mesh.tp > 1:
            batch["each rank"] = (
                f"the {mesh.tp} ranks of a tensor-parallel group read the same micro-batch of "
                f"{plan.micro_batch_size} rows, each holding 1/{mesh.tp} of every attention and MLP weight"
            )
        if mesh.sp > 1:
            batch["each rank"] = (
                f"each micro-batch of {plan.micro_batch_size} rows is split along its tokens over the "
                f"{mesh.sp} ranks of a sequence-parallel group (rows padded to a multiple of {mesh.sp} "
                "tokens)"
            )
        nodes = max(1, plan.world_size // max(1, plan.gpus_per_node))
        return {"mesh": f"{mesh.describe()}; {mesh.per_node(nodes)}", "batch": batch}

    def verify(self, accelerator: Any, world_size: int | None = None) -> None:
        """Refuse to train when accelerate silently fell back to something else."""
        self._verify_live(accelerator, self.expected_distributed_types(accelerator.num_processes), world_size)

    def verify_loop(self, accelerator: Any, world_size: int, modules: list[Any]) -> None:
        """:meth:`verify` for a loop we own, once its trained ``modules`` are sharded (FSDP checks them)."""
        self.verify(accelerator, world_size)

    def loop_description(self, accelerator: Any) -> str:
        """:meth:`live_description` of a loop we own."""
        return self.live_description(accelerator)

    def loop_report(self, modules: dict[str, Any]) -> dict[str, Any]:
        """What the run report says about how a loop's modules are held (FSDP: each rank's shard)."""
        return {}

    def _verify_live(self, accelerator: Any, want: set[str], world_size: int | None) -> None:
        got = live_type(accelerator)
        if got not in want:
            raise ConfigError(
                f"asked for strategy {type(self).__name__} but accelerate prepared '{got}' "
                f"with {accelerator.num_processes} process(es); expected one of {sorted(want)}",
                key="strategy",
                hint="check the launcher (process count) and stale ACCELERATE_* environment variables",
            )
        if world_size is not None and accelerator.num_processes != world_size:
            raise ConfigError(
                f"the launcher asked for {world_size} process(es) but {accelerator.num_processes} "
                "joined the process group",
                key="launcher.nproc_per_node",
                hint="check WORLD_SIZE / the external launcher's process count",
            )


@component("strategy")
@dataclass(frozen=True)
class Single(Strategy):
    """One process on one device (GPU if present, else CPU)."""

    max_processes: ClassVar[int | None] = 1

    def applicable(self, world_size: int) -> bool:
        return world_size == 1


@component("strategy")
@dataclass(frozen=True)
class DDP(Strategy):
    """torch DistributedDataParallel: one process per device, gradients all-reduced."""

    backend: str = "auto"  # auto = nccl on GPU, gloo on CPU
    find_unused_parameters: bool = False
    bucket_cap_mb: int = 25
    broadcast_buffers: bool = False

    def validate(self) -> None:
        super().validate()
        if self.backend not in ("auto", "nccl", "gloo", "mpi", "ccl"):
            raise ConfigError(f"unknown backend '{self.backend}'", key="strategy.backend")

    def training_args(self, device: str, plan: BatchPlan | None = None) -> dict[str, Any]:
        args = super().training_args(device, plan)
        args.update(
            ddp_backend=None if self.backend == "auto" else self.backend,
            ddp_find_unused_parameters=self.find_unused_parameters,
            ddp_bucket_cap_mb=self.bucket_cap_mb,
            ddp_broadcast_buffers=self.broadcast_buffers,
        )
        return args

    def expected_distributed_types(self, world_size: int) -> set[str]:
        return {"NO"} if world_size == 1 else MULTI_PROCESS

    def applicable(self, world_size: int) -> bool:
        return world_size > 1  # on one rank it is strategy=single

    def memory_shape(self, gpus_per_node: int = 8) -> StrategyShape:
        return StrategyShape("ddp")


@component("strategy")
@dataclass(frozen=True)
class FSDP(Strategy):
    """PyTorch FSDP2 (``fully_shard``): parameters, gradients and optimizer state sharded over ranks; one
    FSDP unit per transformer layer. Trainer-based recipes get it through accelerate's FSDP2 plugin (GPU
    only); loops we own (PPO) call ``fully_shard`` themselves on a plain multi-process accelerator, with
    these same knobs, so they also run on CPU (gloo)."""

    reshard_after_forward: bool = True  # True = full shard (ZeRO-3-like); False = shard grad/optim only
    cpu_offload: bool = False  # parameters and gradients (and the optimizer step) on CPU
    activation_checkpointing: bool = False  # FSDP's own, per wrapped layer
    transformer_layer_cls_to_wrap: list[str] | None = None  # None = the model's _no_split_modules
    state_dict_type: str = "FULL_STATE_DICT"  # checkpoint format; the final model is always gathered
    cpu_ram_efficient_loading: bool = True  # rank 0 loads the weights, the others get them broadcast
    parallel_dims: ClassVar[tuple[str, ...]] = ("tp",)
    tp_size: int = 1  # tensor parallel ranks (transformers' tp_plan at load, FSDP2 over the rest; GPU only)
    sp_size: int = 1  # context parallel ranks (accelerate's cp_size: ring attention; GPU only)

    shards_parameters: ClassVar[bool] = True
    needs_process_group: ClassVar[bool] = True
    wraps_model: ClassVar[bool] = True
    one_dtype_per_shard: ClassVar[bool] = True

    def memory_shape(self, gpus_per_node: int = 8) -> StrategyShape:
        offload = "cpu" if self.cpu_offload else "none"
        stage = 3 if self.reshard_after_forward else 2
        return StrategyShape("fsdp", stage=stage, offload_optimizer=offload, offload_param=offload)

    def device_refusal(self, device: str, dtype: str, owns_loop: bool) -> ConfigError | None:
        if device != "cuda" and (self.tp_size > 1 or self.sp_size > 1):
            what = "tensor parallel" if self.tp_size > 1 else "context parallel"
            return ConfigError(
                f"FSDP2 x {what} needs GPUs: accelerate's ParallelismConfig refuses a split model on "
                f"{device} (it takes FSDP2, multi-GPU or DeepSpeed only), and its ring attention is "
                "CUDA-only",
                key="strategy.tp_size" if self.tp_size > 1 else "strategy.sp_size",
                hint="on CPU: strategy=zero1 with strategy.tp_size / strategy.sp_size (DeepSpeed AutoTP / "
                "Ulysses run over gloo)",
            )
        if device == "cuda" or owns_loop:  # a loop we own shards with fully_shard itself, over gloo too
            return None
        return ConfigError(
            f"FSDP needs GPUs: on {device} accelerate silently falls back to DDP",
            key="strategy",
            hint="use strategy=ddp or a DeepSpeed zero stage on CPU (recipe=ppo runs FSDP2 on CPU)",
        )

    def loop_refusal(self, dtype: str) -> ConfigError | None:
        """What the loop hooks' own FSDP2 sharding does not do (rather than ignore the knob): fp16 (its loss
        scaling would need a sharded gradient scaler), FSDP's activation checkpointing and sharded
        checkpoints (accelerate's plugin only)."""
        refused = {
            "precision": (
                dtype == "fp16",
                "a loop we own (recipe=ppo) under FSDP trains in fp32 or bf16: fp16 loss scaling is not "
                "wired into its FSDP2 sharding",
                "precision=bf16 (FSDP2 computes in bf16 and reduces gradients in fp32)",
            ),
            "strategy.activation_checkpointing": (
                self.activation_checkpointing,
                "a loop we own (recipe=ppo) does not apply FSDP's activation checkpointing",
                "strategy.activation_checkpointing=false, model.gradient_checkpointing=true (the model's)",
            ),
            "strategy.state_dict_type": (
                self.state_dict_type != "FULL_STATE_DICT",
                "a loop we own (recipe=ppo) checkpoints weights and optimizer state gathered whole on rank 0",
                "strategy.state_dict_type=FULL_STATE_DICT",
            ),
        }
        return first_refusal(refused)

    def validate(self) -> None:
        super().validate()
        check_split_sizes(self)
        if self.state_dict_type not in STATE_DICT_TYPES:
            raise ConfigError(
                f"unknown state dict type '{self.state_dict_type}'",
                key="strategy.state_dict_type",
                hint=f"one of {STATE_DICT_TYPES}",
            )

    def fsdp_config(self) -> dict[str, Any]:
        """TrainingArguments' ``fsdp_config`` (transformers turns it into accelerate's FSDP2 plugin)."""
        config: dict[str, Any] = {
            "version": 2,
            "reshard_after_forward": self.reshard_after_forward,
            "cpu_offload": self.cpu_offload,
            "activation_checkpointing": self.activation_checkpointing,
            "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "state_dict_type": self.state_dict_type,
            "cpu_ram_efficient_loading": self.cpu_ram_efficient_loading,
        }
        if self.transformer_layer_cls_to_wrap:
            config["transformer_layer_cls_to_wrap"] = list(self.transformer_layer_cls_to_wrap)
        return config

    def training_args(self, device: str, plan: BatchPlan | None = None) -> dict[str, Any]:
        args = super().training_args(device, plan)
        if (
            self.tp_size > 1
        ):  # sharded as it loaded (model_load_kwargs): the Trainer sets its parallelism config
            return args
        args.update(fsdp=True, fsdp_config=self.fsdp_config())
        if self.sp_size > 1 and plan is not None:
            args["parallelism_config"] = model_parallel.context_parallel_config(
                self.sp_size, plan.data_parallel_size
            )
        return args

    def sequence_refusal(self, attention: str, packed: bool) -> ConfigError | None:
        """Context parallel (ring attention) runs SDPA only, and on rows of one document (a causal mask)."""
        if attention != "sdpa":
            return ConfigError(
                f"context parallel (FSDP2 strategy.sp_size) runs SDPA only, not {attention}",
                key="model.attn_implementation",
                hint="model.attn_implementation=sdpa",
            )
        if packed:
            return ConfigError(
                "context parallel (ring attention) takes causal rows of one document: not packed rows",
                key="data.packing",
                hint="data.packing=false",
            )
        return None

    def model_load_kwargs(self, plan: BatchPlan) -> dict[str, Any]:
        """Tensor parallel: the model loads split by its ``tp_plan`` and FSDP2-sharded over the rest."""
        if self.tp_size == 1:
            return {}
        return {
            "distributed_config": model_parallel.distributed_config(self.tp_size, plan.data_parallel_size)
        }

    def expected_distributed_types(self, world_size: int) -> set[str]:
        if self.tp_size > 1:  # no FSDP plugin: the model was sharded as it loaded
            return {"FSDP", *MULTI_PROCESS}
        return {"FSDP"}

    def describe(self, plan: BatchPlan, device: str = "cuda") -> dict[str, Any]:
        return {**super().describe(plan, device), "fsdp_config": self.fsdp_config()}

    def files(self, plan: BatchPlan, device: str) -> dict[str, Any]:
        return {"fsdp.json": self.fsdp_config()}

    def verify(self, accelerator: Any, world_size: int | None = None) -> None:
        super().verify(accelerator, world_size)
        if self.tp_size > 1:
            return  # sharded at load: verify_built reads the model's own mesh
        version = getattr(accelerator.state.fsdp_plugin, "fsdp_version", None)
        if version != 2:
            raise ConfigError(f"expected FSDP2, accelerate prepared FSDP{version}", key="strategy")
        config = getattr(accelerator, "parallelism_config", None)
        live_cp = config.cp_size if config is not None else 1
        if live_cp != self.sp_size:
            raise ConfigError(
                f"asked for context parallel over {self.sp_size} ranks but accelerate set up {live_cp}",
                key="strategy.sp_size",
            )

    def verify_built(self, model: Any, mesh: Mesh) -> dict[str, Any]:
        """Tensor parallel: the model's own tp size (transformers records it at load) is the mesh's."""
        if self.tp_size == 1:
            return {}
        live = getattr(model, "tp_size", None) or getattr(getattr(model, "base_model", None), "tp_size", None)
        if live != self.tp_size:
            raise ConfigError(
                f"asked for tensor parallel over {self.tp_size} ranks; the model loaded with tp_size {live}",
                key="strategy.tp_size",
            )
        return {"tensor parallel (transformers tp_plan)": live, "fsdp2 shards": mesh.dp}

    # ---- loops we own: the inherited plain multi-process loop_accelerator (the process group, device
    # and autocast; not accelerate's FSDP plugin) and fully_shard on the modules themselves ----------
    def shard_trained(self, accelerator: Any, module: Any) -> Any:
        """``module`` sharded with ``fully_shard`` as the knobs say: one unit per transformer layer, then
        its root; ``cpu_offload`` → ``CPUOffloadPolicy``; bf16/fp16 runs compute in that dtype and reduce
        gradients in fp32 (``MixedPrecisionPolicy``)."""
        from components.distributed import fsdp

        return fsdp.shard(
            module,
            device=accelerator.device.type,
            layer_classes=fsdp.layer_class_names(module, self.transformer_layer_cls_to_wrap),
            reshard_after_forward=self.reshard_after_forward,
            cpu_offload=self.cpu_offload,
            mixed_precision=str(accelerator.mixed_precision),
        )

    def prepare_frozen(self, accelerator: Any, build: Callable[[], Any]) -> Any:
        """A frozen model (PPO's reference, a reward model) sharded like the trained ones, for inference."""
        return self.shard_trained(accelerator, build().eval().requires_grad_(False))

    def prepare_loop(
        self,
        accelerator: Any,
        modules: dict[str, Any],
        optimizer: Any,
        combine: Callable[[dict[str, Any]], Any],
    ) -> PreparedLoop:
        """Nothing to prepare: the modules are sharded already (a DDP wrapper would all-reduce twice) and
        the loop steps its own optimizer and schedule."""
        return PreparedLoop(dict(modules), optimizer)

    def generation(self, module: Any) -> contextlib.AbstractContextManager[None]:
        from components.distributed import fsdp

        return fsdp.gathered(module, self.reshard_after_forward)

    def gather_loop_weights(self, accelerator: Any, module: Any) -> dict[str, Any] | None:
        from components.distributed import fsdp

        return fsdp.full_state_dict(module) or None

    def verify_loop(self, accelerator: Any, world_size: int, modules: list[Any]) -> None:
        """Plain processes joined the group (not accelerate's FSDP, not one process fewer), and every
        trained module really is an FSDP2 unit: no silent fallback to whole weights per rank."""
        import torch.distributed as dist

        from components.distributed import fsdp

        self._verify_live(accelerator, {"NO", *MULTI_PROCESS}, world_size)  # one process: either
        whole = [type(m).__name__ for m in modules if not fsdp.is_sharded(m)]
        group = dist.get_world_size() if dist.is_initialized() else 0
        if whole or group != world_size:
            raise ConfigError(
                f"FSDP2 did not shard the loop's modules over {world_size} process(es) "
                f"(unsharded: {whole}, process group of {group})",
                key="strategy",
            )

    def loop_description(self, accelerator: Any) -> str:
        return f"FSDP2 (fully_shard), {accelerator.num_processes} process(es)"

    def loop_report(self, modules: dict[str, Any]) -> dict[str, Any]:
        """Elements of each module's parameters held by this rank, next to the whole count."""
        import os

        from components.distributed import fsdp

        rank = int(os.environ.get("RANK", 0))
        report: dict[str, Any] = {}
        for name, module in modules.items():
            local, full = fsdp.parameter_counts(module)
            report[f"{name} parameters on rank {rank}"] = local
            report[f"{name} parameters in all"] = full
        return report


@component("strategy")
@dataclass(frozen=True)
class DeepSpeed(Strategy):
    """DeepSpeed ZeRO stage 0-3, with CPU/NVMe offload and ZeRO++ as options.

    Every knob below is a DeepSpeed config key; sizes left ``null`` are derived from the model's hidden
    size the way DeepSpeed's HF integration does (``hidden²`` buckets), never left as ``"auto"``.
    """

    stage: int = 2
    offload_optimizer: str = "none"  # none | cpu | nvme
    offload_param: str = "none"  # none | cpu | nvme (stage 3 only)
    pin_memory: bool = True
    nvme_path: str | None = None  # ZeRO-Infinity swap dir (a fast local NVMe disk)
    overlap_comm: bool = True
    contiguous_gradients: bool = True
    reduce_scatter: bool = True
    reduce_bucket_size: float | None = None  # elements; null = hidden²
    allgather_bucket_size: float | None = None  # elements; null = hidden² (stages 1-2)
    stage3_prefetch_bucket_size: float | None = None  # null = 0.9·hidden²
    stage3_param_persistence_threshold: float | None = None  # null = 10·hidden
    stage3_max_live_parameters: float = 1e9
    stage3_max_reuse_distance: float = 1e9
    stage3_gather_16bit_weights_on_model_save: bool = True  # false: consolidate with zero_to_fp32
    sub_group_size: float = 1e9
    round_robin_gradients: bool = False
    communication_data_type: str | None = None  # fp32 | fp16 | bf16; null = the training dtype
    zero_quantized_weights: bool = False  # ZeRO++ qwZ
    zero_quantized_gradients: bool = False  # ZeRO++ qgZ
    zero_hpz_partition_size: int | None = 1  # ZeRO++ hpZ: secondary partition size; null = GPUs per node
    offload_param_buffer_size: float | None = None  # NVMe param swap buffer (elements); null = largest shard
    optimizer_impl: str = "auto"  # auto | torch | deepspeed (DeepSpeed's CPU Adam under offload)
    parallel_dims: ClassVar[tuple[str, ...]] = ("tp", "sp")
    tp_size: int = 1  # tensor parallel ranks (DeepSpeed AutoTP); data parallel = world / (tp x sp)
    sp_size: int = 1  # sequence parallel ranks (DeepSpeed Ulysses)
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
        if self.stage not in (0, 1, 2, 3):
            raise ConfigError(f"unknown ZeRO stage {self.stage}", key="strategy.stage", hint="0, 1, 2 or 3")
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
        check_split_sizes(self)

    needs_process_group: ClassVar[bool] = True
    wraps_model: ClassVar[bool] = True
    scales_loss: ClassVar[bool] = True
    loop_engine: ClassVar[bool] = True

    @property
    def shards_parameters(self) -> bool:  # type: ignore[override]
        return self.stage == 3 or self.tp_size > 1

    @property
    def generates_together(self) -> bool:
        return self.tp_size > 1

    @property
    def partitions_at_load(self) -> bool:  # type: ignore[override]
        return self.stage == 3

    @property
    def label(self) -> str:
        split = f", AutoTP {self.tp_size}" if self.tp_size > 1 else ""
        split += f", Ulysses SP {self.sp_size}" if self.sp_size > 1 else ""
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

    def split_refusal(self, device: str, dtype: str) -> ConfigError | None:
        """What AutoTP / Ulysses are not run with here: offload and ZeRO++ (not measured with a split
        model); ZeRO-3 with tensor parallel unless ``TP_ZERO3`` (measured equal to ZeRO-3 on one process);
        Ulysses under ZeRO-3 (measured different, whichever ``reduce_scatter``)."""
        if self.tp_size == 1 and self.sp_size == 1:
            return None
        knob = "strategy.tp_size" if self.tp_size > 1 else "strategy.sp_size"
        what = "tensor parallel (AutoTP)" if self.tp_size > 1 else "sequence parallel (Ulysses)"
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
        if self.stage == 3 and self.tp_size > 1 and not TP_ZERO3:
            return ConfigError(
                "tensor parallel (AutoTP) under ZeRO-3 is not supported here",
                key="strategy.stage",
                hint="strategy=zero1 or zero2 with strategy.tp_size (the optimizer state is sharded over the "
                "data-parallel replicas)",
            )
        if self.stage == 3 and self.sp_size > 1:
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
        hpz = self.hpz_partition_size(plan)
        if hpz > 1 and plan.world_size % hpz:
            raise ConfigError(
                f"ZeRO++ hpZ partition size {hpz} does not divide the {plan.world_size} process(es)",
                key="strategy.zero_hpz_partition_size",
                hint="null (= launcher.nproc_per_node, the GPUs per node) or a divisor of the world size",
            )

    def uses_deepspeed_optimizer(self, device: str, optimizer: Any) -> bool:
        """DeepSpeed's own (CPU) Adam under optimizer offload on GPU: the torch optimizer would run the
        step on CPU tensors ~5x slower. On CPU-only hosts the torch optimizer avoids a 60 s JIT build."""
        if self.optimizer_impl != "auto":
            return self.optimizer_impl == "deepspeed"
        return self.offload_optimizer != "none" and device == "cuda" and optimizer.deepspeed_cpu_adam

    def hpz_partition_size(self, plan: BatchPlan) -> int:
        """hpZ's secondary partition: the knob, or the processes per node (the copy stays in-node)."""
        if self.stage != 3:
            return 1
        return int(self.zero_hpz_partition_size or plan.gpus_per_node)

    def param_buffer_size(self, plan: BatchPlan) -> int:
        """Elements of one NVMe parameter swap buffer: the knob, or this rank's shard of the largest weight
        (DeepSpeed asserts a shard fits one buffer; its 1e8 default is below a 128k-vocab embedding)."""
        if self.offload_param_buffer_size is not None:
            return int(self.offload_param_buffer_size)
        if not plan.largest_param:
            return int(1e8)  # DeepSpeed's default
        return -(-plan.largest_param // max(1, plan.world_size))  # ceil: the largest shard

    def _offload(self, target: str, *, params: bool, plan: BatchPlan | None = None) -> dict[str, Any]:
        block: dict[str, Any] = {"device": target, "pin_memory": self.pin_memory}
        if target == "nvme":
            block["nvme_path"] = self.nvme_path
            block["buffer_count"] = 5 if params else 4
            if params and plan is not None:
                block["buffer_size"] = self.param_buffer_size(plan)
        if not params:
            block["ratio"] = 1.0
        return block

    def zero_config(self, plan: BatchPlan) -> dict[str, Any]:
        """The ``zero_optimization`` block with every size concrete."""
        hidden_size = plan.hidden_size
        h2 = hidden_size * hidden_size if hidden_size else None

        def size(value: float | None, derived: float | None, default: float) -> int:
            if value is not None:
                return int(value)
            return int(derived) if derived else int(default)

        zero: dict[str, Any] = {"stage": self.stage}
        if (
            self.tp_size > 1
        ):  # the final save gathers the tensor-parallel shards (accelerate's get_state_dict)
            zero["stage3_gather_16bit_weights_on_model_save"] = True
        if self.stage == 0:
            return zero
        zero.update(
            overlap_comm=self.overlap_comm,
            contiguous_gradients=self.contiguous_gradients,
            reduce_scatter=self.reduce_scatter,
            reduce_bucket_size=size(self.reduce_bucket_size, h2, 5e8),
            round_robin_gradients=self.round_robin_gradients,
            sub_group_size=int(self.sub_group_size),
        )
        if self.offload_optimizer != "none":
            zero["offload_optimizer"] = self._offload(self.offload_optimizer, params=False)
        if self.stage < 3:
            zero["allgather_partitions"] = True
            zero["allgather_bucket_size"] = size(self.allgather_bucket_size, h2, 5e8)
            return zero
        zero.update(
            stage3_prefetch_bucket_size=size(self.stage3_prefetch_bucket_size, 0.9 * h2 if h2 else None, 5e7),
            stage3_param_persistence_threshold=size(
                self.stage3_param_persistence_threshold, 10 * hidden_size if hidden_size else None, 1e5
            ),
            stage3_max_live_parameters=int(self.stage3_max_live_parameters),
            stage3_max_reuse_distance=int(self.stage3_max_reuse_distance),
            stage3_gather_16bit_weights_on_model_save=self.stage3_gather_16bit_weights_on_model_save,
            zero_quantized_weights=self.zero_quantized_weights,
            zero_quantized_gradients=self.zero_quantized_gradients,
            zero_hpz_partition_size=self.hpz_partition_size(plan),
        )
        if self.offload_param != "none":
            zero["offload_param"] = self._offload(self.offload_param, params=True, plan=plan)
        return zero

    def deepspeed_config(self, plan: BatchPlan, device: str = "cuda") -> dict[str, Any]:
        """The full DeepSpeed config for this run, no ``"auto"`` anywhere.

        Batch sizes and clipping come from the same ``BatchPlan`` as the trainer's arguments, so the two
        cannot disagree (train batch = micro x accumulation x world size). Precision blocks follow the
        resolved dtype. The HF/DeepSpeed rule for optimizers: without an ``optimizer`` block the
        trainer's torch optimizer and scheduler are used (``zero_allow_untested_optimizer``); under
        offload on GPU DeepSpeed's CPU Adam is configured instead and the HF scheduler still drives it.
        """
        config: dict[str, Any] = {
            "train_micro_batch_size_per_gpu": plan.micro_batch_size,
            "gradient_accumulation_steps": plan.gradient_accumulation_steps,
            "train_batch_size": plan.global_batch_size,
            "gradient_clipping": float(plan.max_grad_norm),
            "zero_optimization": self.zero_config(plan),
            "bf16": {"enabled": plan.dtype == "bf16"},
            "fp16": {"enabled": plan.dtype == "fp16"},
            "zero_allow_untested_optimizer": True,
            "zero_force_ds_cpu_optimizer": False,
            "steps_per_print": 10**9,
            "wall_clock_breakdown": False,
        }
        if plan.dtype == "fp16" and plan.precision is not None:
            p = plan.precision
            config["fp16"].update(
                loss_scale=float(p.loss_scale),
                initial_scale_power=int(p.initial_scale_power),
                loss_scale_window=int(p.loss_scale_window),
                hysteresis=int(p.hysteresis),
                min_loss_scale=float(p.min_loss_scale),
            )
        if self.tp_size > 1:
            config["tensor_parallel"] = model_parallel.autotp_block(self.tp_size)
        if self.tp_size * self.sp_size > 1:
            # DeepSpeed derives it (micro x accumulation x its own count of ranks); a value here would have to
            # be world-based for the HF Trainer's check and data-parallel based for DeepSpeed's, both at once
            del config["train_batch_size"]
        if self.communication_data_type:
            config["communication_data_type"] = self.communication_data_type
        if "nvme" in (self.offload_optimizer, self.offload_param):
            config["aio"] = dict(self.aio)
        if self.uses_deepspeed_optimizer(device, plan.optimizer):
            o = plan.optimizer
            config["optimizer"] = {
                "type": "AdamW",
                "params": {
                    "lr": float(o.lr),
                    "betas": [float(b) for b in o.betas],
                    "eps": float(o.eps),
                    "weight_decay": float(o.weight_decay),
                },
            }
        return config

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

    def inference_config(self, plan: BatchPlan, device: str = "cuda") -> dict[str, Any]:
        """The config of frozen models' engines: the trained model's ZeRO stage and parameter offload,
        no optimizer (so no optimizer offload), no accumulation."""
        config = self.deepspeed_config(dataclasses.replace(plan, gradient_accumulation_steps=1), device)
        config.pop("optimizer", None)
        config["zero_optimization"].pop("offload_optimizer", None)
        return config

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
        the shards gathered into whole weights (in the training dtype)."""
        if self.tp_size > 1:
            return trainer.accelerator.get_state_dict(trainer.model_wrapped)
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
        """The TP / SP groups DeepSpeed made and this rank's shards (``model_parallel.deepspeed_layout``)."""
        if mesh.is_data_parallel_only:
            return {}
        from components.distributed import model_parallel

        return model_parallel.deepspeed_layout(model, mesh)


def check_split_sizes(strategy: Strategy) -> None:
    """``tp_size`` and ``sp_size`` are at least 1, and not both above 1: the engines do not compose them
    through the Trainer (DeepSpeed's AutoTP and Ulysses each make the groups the other would need)."""
    for key in ("tp_size", "sp_size"):
        if getattr(strategy, key) < 1:
            raise ConfigError(f"must be >= 1, got {getattr(strategy, key)}", key=f"strategy.{key}")
    if strategy.tp_size > 1 and strategy.sp_size > 1:
        raise ConfigError(
            f"tensor parallel (tp_size={strategy.tp_size}) and sequence parallel "
            f"(sp_size={strategy.sp_size}) together are not supported: the engines do not compose them "
            "through the Trainer",
            key="strategy.sp_size",
            hint="use one of them (tp_size for weights that do not fit, sp_size for sequences that do not)",
        )


@component("strategy")
@dataclass(frozen=True)
class Pipeline(Strategy):
    """Pipeline parallel (``torch.distributed.pipelining``): the decoder layers cut into ``pp_size`` stages
    (x ``stages_per_rank`` under an interleaved schedule), each rank holding only its stages, micro-batches
    (``train.gradient_accumulation_steps`` per step) flowing through them on a GPipe, 1F1B or interleaved 1F1B
    schedule; ``world / pp_size`` data-parallel replicas, each with its own data, gradients summed over them.
    Trained by our own loop (``components/runtime/pipeline.py``); CPU (gloo) and GPU."""

    pp_size: int = 2  # pipeline ranks; world / pp_size data-parallel replicas
    schedule: str = "1f1b"  # gpipe | 1f1b | interleaved_1f1b
    stages_per_rank: int = 1  # > 1: interleaved_1f1b (virtual stages, a smaller bubble)
    split: list[int] = field(default_factory=list)  # the first layer of stages 1..N-1; [] = balanced
    tp_size: int = 1  # tensor parallel inside each stage (3D): not built, refused above 1

    shards_parameters: ClassVar[bool] = True  # no rank holds the whole model: saving gathers it
    parallel_dims: ClassVar[tuple[str, ...]] = ("pp",)  # strategy=auto tries strategy.pp_size
    needs_process_group: ClassVar[bool] = True
    wraps_model: ClassVar[bool] = True
    splits_layers: ClassVar[bool] = True

    @property
    def label(self) -> str:
        return f"Pipeline (pp {self.pp_size}, {self.schedule})"

    @property
    def num_stages(self) -> int:
        return self.pp_size * self.stages_per_rank

    def mesh(self, world_size: int) -> Mesh:
        return Mesh(world_size, pp=self.pp_size)

    def applicable(self, world_size: int) -> bool:
        return world_size >= self.pp_size and world_size % self.pp_size == 0

    def memory_shape(self, gpus_per_node: int = 8) -> StrategyShape:
        """Each replica's stages whole (``mesh()`` says how the layers split), the schedule's micro-batches
        in flight."""
        return StrategyShape("ddp", pipeline_schedule=self.schedule, pipeline_chunks=self.stages_per_rank)

    def validate(self) -> None:
        super().validate()
        if self.tp_size != 1:
            raise ConfigError(
                f"strategy=pipeline does not split its stages' layers over tensor-parallel ranks (3D, "
                f"tp_size={self.tp_size}): each stage is whole on its rank",
                key="strategy.tp_size",
                hint="strategy.tp_size=1 with strategy=pipeline (pp x dp), or strategy=zero1 "
                "strategy.tp_size=N for tensor parallel (tp x dp)",
            )
        if self.schedule not in SCHEDULES:
            raise ConfigError(
                f"unknown schedule '{self.schedule}'",
                key="strategy.schedule",
                hint=f"one of {SCHEDULES}",
            )
        if self.schedule == "interleaved_1f1b" and self.stages_per_rank < 2:
            raise ConfigError(
                "interleaved_1f1b runs several stages per rank",
                key="strategy.stages_per_rank",
                hint="strategy.stages_per_rank=2 (or more), or strategy.schedule=1f1b",
            )
        if self.schedule != "interleaved_1f1b" and self.stages_per_rank != 1:
            raise ConfigError(
                f"{self.schedule} runs one stage per rank",
                key="strategy.stages_per_rank",
                hint="strategy.stages_per_rank=1, or strategy.schedule=interleaved_1f1b",
            )

    def combination_refusal(
        self, recipe: Any, peft: Any, quantization: Any, dtype: str, data: Any = None, model: Any = None
    ) -> ConfigError | None:
        refused = {
            "recipe": (
                not recipe.trains_in_stages,
                f"recipe={recipe.name} does not train through the pipeline loop (its loss is not the "
                "causal-LM cross-entropy on its data's labels that the stages compute)",
                "recipe=sft, or strategy=fsdp / a DeepSpeed zero stage for this recipe",
            ),
            "quantization": (
                quantization.enabled,
                "a quantized base is not cut into pipeline stages",
                "quantization=none (or strategy=ddp / zero2 for QLoRA)",
            ),
            "peft": (
                peft.adds_virtual_tokens,
                "prompt-learning adapters prepend virtual tokens to the first stage's input, which the "
                "pipeline's fixed-shape activations do not carry",
                "peft=lora (or none), or another strategy for this adapter",
            ),
            "precision": (
                dtype == "fp16",
                "fp16 loss scaling is not wired across pipeline stages",
                "precision=bf16 (or fp32)",
            ),
            "data.packing": (
                data is not None and bool(getattr(data, "packing", False)),
                "packed rows are not split into pipeline micro-batches: the stages pad rows to one length",
                "data.packing=false",
            ),
            "model.compile": (
                bool(getattr(model, "compile", False)),
                "torch.compile is not applied to pipeline stages",
                "model.compile=false",
            ),
            "model.liger": (
                getattr(model, "liger", None) is True,
                "Liger's kernels patch the whole model's modules, not pipeline stages",
                "model.liger=null (off under strategy=pipeline)",
            ),
        }
        return first_refusal(refused)

    def training_args(self, device: str, plan: BatchPlan | None = None) -> dict[str, Any]:
        """The trainer only prepares data, optimizer and schedule here: nothing of its own training loop
        applies (no Liger patching, no torch.compile of the cut model)."""
        return {**super().training_args(device, plan), "use_liger_kernel": False, "torch_compile": False}

    def check(self, plan: BatchPlan, device: str) -> None:
        """The mesh (pp_size divides the world), the model (a family cut here, enough layers, a valid
        split) and the schedule (1F1B with fewer micro-batches than stages)."""
        self.mesh(plan.world_size).check()
        if plan.architecture is None:
            raise ConfigError(
                "strategy=pipeline needs the model's architecture to plan its stages, and it cannot be read",
                key="model.name_or_path",
                hint="a local model dir, a cached hub model, or the architecture numbers in the model YAML",
            )
        self.stage_plan(plan.architecture)
        m = plan.gradient_accumulation_steps
        if self.schedule == "interleaved_1f1b" and m % max(1, m // self.pp_size):
            raise ConfigError(
                f"interleaved 1F1B runs its micro-batches in rounds of pp_size={self.pp_size}: "
                f"{m} micro-batches per step do not divide into them",
                key="train.gradient_accumulation_steps",
                hint=f"a multiple of {self.pp_size} (or fewer than {self.pp_size}); a smaller "
                "train.micro_batch_size keeps the global batch",
            )
        if self.schedule == "1f1b" and m < self.num_stages:
            import logging

            logging.getLogger("hydratune").warning(
                "strategy=pipeline: %d micro-batch(es) per step for %d stages: the stages take turns "
                "(bubble %.0f%%) and 1F1B runs as GPipe; raise train.gradient_accumulation_steps (a smaller "
                "train.micro_batch_size keeps the global batch)",
                m,
                self.num_stages,
                100 * self.bubble(m),
            )

    def stage_plan(self, architecture: Any) -> Any:
        """The split of a model of ``architecture`` (its config) into stages, the one the run uses and
        ``mode=plan`` prints (``components/distributed/stages.py``), or a ConfigError naming the fix: the
        family, the layer count, ``strategy.split``. Balanced like the memory estimate's stages."""
        from components.distributed import stages
        from components.memory.parallel import balanced_split

        why = stages.refusal(architecture)
        if why is not None:
            raise ConfigError(
                f"strategy=pipeline cannot cut this model into stages: {why}",
                key="strategy",
                hint="use strategy=fsdp or a DeepSpeed zero stage (zero3) for this model",
            )
        model = stages.meta_model(architecture)
        return stages.plan_stages(model, self.num_stages, self.pp_size, self.split, balance=balanced_split)

    def bubble(self, micro_batches: int) -> float:
        """The theoretical bubble of ``micro_batches`` per step: (p - 1) / (m + p - 1), interleaved
        (p - 1) / (v m + p - 1) (the estimate's own formula)."""
        from components.memory.parallel import bubble_fraction

        return bubble_fraction(self.pp_size, micro_batches, self.schedule, self.stages_per_rank)

    def describe(self, plan: BatchPlan, device: str = "cuda") -> dict[str, Any]:
        stage_plan = self.stage_plan(plan.architecture)
        m, dp = plan.gradient_accumulation_steps, self.mesh(plan.world_size).dp
        described = super().describe(plan, device)
        described["batch"]["global_batch_size"] = (
            f"{plan.micro_batch_size} x {m} x {dp} (data-parallel replicas) = {plan.global_batch_size}"
        )
        described["pipeline"] = {
            "mesh": self.mesh(plan.world_size).describe(),
            "schedule": f"{self.schedule}: {self.num_stages} stages, {self.stages_per_rank} per rank",
            "micro-batches per step": f"{m} (train.gradient_accumulation_steps), each of "
            f"train.micro_batch_size={plan.micro_batch_size} rows per replica",
            **{
                f"stage {s} (pipeline rank {stage_plan.rank_of(s)})": stage_plan.describe(s)
                for s in range(stage_plan.num_stages)
            },
            "bubble (theoretical)": round(self.bubble(m), 4),
        }
        return described


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


def training_options() -> dict[str, Strategy]:
    """Every option of conf/strategy/ that trains, built (``auto``, which picks among these, is not one),
    fastest first in the assumed order (then by name): the estimate's every-strategy table,
    ``strategy=auto``'s ladder and the support matrix list these. Built once per conf/ (components are
    frozen: sharing them is safe)."""
    from components.config import options

    return dict(_training_options(options.CONF))


@functools.cache
def _training_options(conf: Path) -> tuple[tuple[str, Strategy], ...]:
    from components.config.options import options

    built = {name: option.build() for name, option in options("strategy", conf).items()}
    trains = [(name, strategy) for name, strategy in built.items() if isinstance(strategy, Strategy)]
    return tuple(sorted(trains, key=lambda item: (-item[1].memory_shape().speed, item[0])))
