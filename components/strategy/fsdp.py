"""``strategy=fsdp``: PyTorch FSDP2, through accelerate's plugin for the Trainer and ``fully_shard`` itself
for the loops we own (``components/distributed/fully_shard.py``)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from hydratune.components.config.errors import ConfigError
from hydratune.components.config.registry import component
from hydratune.components.distributed import model_parallel
from hydratune.components.distributed.mesh import Mesh
from hydratune.components.memory.shapes import StrategyShape
from hydratune.components.strategy.core import (
    MULTI_PROCESS,
    BatchPlan,
    ModelSplit,
    OwnLoop,
    PreparedLoop,
    Strategy,
    first_refusal,
    knobs_refusal,
)

STATE_DICT_TYPES = ("FULL_STATE_DICT", "SHARDED_STATE_DICT")


@component("strategy")
@dataclass(frozen=True)
class FSDP(ModelSplit, OwnLoop, Strategy):
    """PyTorch FSDP2 (``fully_shard``): parameters, gradients and optimizer state sharded over ranks; one
    FSDP unit per transformer layer. Trainer-based recipes get it through accelerate's FSDP2 plugin (GPU
    only); loops we own (PPO) call ``fully_shard`` themselves on a plain multi-process accelerator, with
    these same knobs, so they also run on CPU (gloo)."""

    reshard_after_forward: bool = True  # True = full shard (ZeRO-3-like); False = shard grad/optim only
    cpu_offload: bool = False  # parameters and gradients (and the optimizer step) on CPU
    # FSDP's own, per wrapped layer: accelerate's plugin only (not PPO's own loop, which refuses it)
    activation_checkpointing: bool = False
    transformer_layer_cls_to_wrap: list[str] | None = None  # None = the model's _no_split_modules
    # checkpoint format: FULL_STATE_DICT, or SHARDED_STATE_DICT for faster checkpoints of big models (the
    # Trainer path; PPO's own loop gathers, and refuses it); the final model is always gathered
    state_dict_type: str = "FULL_STATE_DICT"
    cpu_ram_efficient_loading: bool = True  # rank 0 loads the weights, the others get them broadcast

    #: tp: transformers' tp_plan at load, FSDP2 over the rest; sp: context parallel (accelerate's cp_size,
    #: ring attention), both GPU only; pp: FSDP2 on each stage over the replicas (torchtitan's PP x FSDP)
    axes: ClassVar[frozenset[str]] = frozenset({"tp", "sp", "pp"})
    searched_axes: ClassVar[tuple[str, ...]] = ("tp",)
    shards_parameters: ClassVar[bool] = True
    needs_process_group: ClassVar[bool] = True
    wraps_model: ClassVar[bool] = True
    one_dtype_per_shard: ClassVar[bool] = True

    def memory_shape(self, gpus_per_node: int = 8) -> StrategyShape:
        offload = "cpu" if self.cpu_offload else "none"
        stage = 3 if self.reshard_after_forward else 2
        return StrategyShape("fsdp", stage=stage, offload_optimizer=offload, offload_param=offload)

    @property
    def stage_sharding(self) -> int | None:
        """FSDP2 on each stage over the replicas, resharding after forward (ZeRO-3) or not (ZeRO-2)."""
        return 3 if self.reshard_after_forward else 2

    def axis_refusal(self, device: str | None = None, dtype: str | None = None) -> ConfigError | None:
        """With pipeline stages the staged loop shards each stage with FSDP2 itself (one unit per decoder
        layer, checkpoints gathered whole): none of this option's own sharding knobs. Tensor and context
        parallel go through accelerate's ParallelismConfig, which refuses a split model off a GPU."""
        p = self.parallel
        if p.pp > 1:
            knobs = {
                "cpu_offload": self.cpu_offload,
                "activation_checkpointing": self.activation_checkpointing,
                "transformer_layer_cls_to_wrap": bool(self.transformer_layer_cls_to_wrap),
                "state_dict_type": self.state_dict_type != "FULL_STATE_DICT",
            }
            return knobs_refusal(
                self,
                knobs,
                f"pipeline stages (strategy.pp_size={p.pp}) train through the pipeline loop, which shards "
                "each stage with FSDP2 over the data-parallel replicas (one unit per decoder layer, "
                "checkpoints gathered whole) and",
                f"strategy=fsdp strategy.pp_size={p.pp} with {{key}} left at its default, or drop "
                "strategy.pp_size",
            )
        if device is not None and device != "cuda" and (p.tp > 1 or p.sp > 1):
            what = "tensor parallel" if p.tp > 1 else "context parallel"
            return ConfigError(
                f"FSDP2 x {what} needs GPUs: accelerate's ParallelismConfig refuses a split model on "
                f"{device} (it takes FSDP2, multi-GPU or DeepSpeed only), and its ring attention is "
                "CUDA-only",
                key="strategy.tp_size" if p.tp > 1 else "strategy.sp_size",
                hint="on CPU: strategy=zero1 with strategy.tp_size / strategy.sp_size (DeepSpeed AutoTP / "
                "Ulysses run over gloo)",
            )
        return None

    def device_refusal(self, device: str, dtype: str, owns_loop: bool) -> ConfigError | None:
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
        from hydratune.components.distributed import fully_shard

        return fully_shard.shard(
            module,
            device=accelerator.device.type,
            layer_classes=fully_shard.layer_class_names(module, self.transformer_layer_cls_to_wrap),
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
        from hydratune.components.distributed import fully_shard

        return fully_shard.gathered(module, self.reshard_after_forward)

    def gather_loop_weights(self, accelerator: Any, module: Any) -> dict[str, Any] | None:
        from hydratune.components.distributed import fully_shard

        return fully_shard.full_state_dict(module) or None

    def verify_loop(self, accelerator: Any, world_size: int, modules: list[Any]) -> None:
        """Plain processes joined the group (not accelerate's FSDP, not one process fewer), and every
        trained module really is an FSDP2 unit: no silent fallback to whole weights per rank."""
        import torch.distributed as dist

        from hydratune.components.distributed import fully_shard

        self._verify_live(accelerator, {"NO", *MULTI_PROCESS}, world_size)  # one process: either
        whole = [type(m).__name__ for m in modules if not fully_shard.is_sharded(m)]
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

        from hydratune.components.distributed import fully_shard

        rank = int(os.environ.get("RANK", 0))
        report: dict[str, Any] = {}
        for name, module in modules.items():
            local, full = fully_shard.parameter_counts(module)
            report[f"{name} parameters on rank {rank}"] = local
            report[f"{name} parameters in all"] = full
        return report
