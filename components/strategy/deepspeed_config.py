"""DeepSpeed's JSON, generated: functions of the ``zero*`` option's knobs (``knobs``: its ``DeepSpeed``
component, ``deepspeed.py``) and the run's :class:`~hydratune.components.strategy.core.BatchPlan`, every
``"auto"`` resolved and every size concrete (sizes left null derive from the model's hidden size the way
DeepSpeed's HF integration does). The trainer's arguments and this config come from the same plan, so they
cannot disagree.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hydratune.components.distributed import model_parallel
from hydratune.components.strategy.core import BatchPlan


def uses_deepspeed_optimizer(knobs: Any, device: str, optimizer: Any) -> bool:
    """DeepSpeed's own (CPU) Adam under optimizer offload on GPU: the torch optimizer would run the
    step on CPU tensors ~5x slower. On CPU-only hosts the torch optimizer avoids a 60 s JIT build. Expert
    parallel: DeepSpeed builds the optimizer after AutoEP replaced the mixture blocks, with the experts in
    their own groups (a caller's optimizer has none: ZeRO stops on it)."""
    if knobs.ep_size > 1:
        return True
    if knobs.optimizer_impl != "auto":
        return knobs.optimizer_impl == "deepspeed"
    return knobs.offload_optimizer != "none" and device == "cuda" and optimizer.deepspeed_cpu_adam


def hpz_partition_size(knobs: Any, plan: BatchPlan) -> int:
    """hpZ's secondary partition: the knob, or the processes per node (the copy stays in-node)."""
    if knobs.stage != 3:
        return 1
    return int(knobs.zero_hpz_partition_size or plan.gpus_per_node)


def param_buffer_size(knobs: Any, plan: BatchPlan) -> int:
    """Elements of one NVMe parameter swap buffer: the knob, or this rank's shard of the largest weight
    (DeepSpeed asserts a shard fits one buffer; its 1e8 default is below a 128k-vocab embedding)."""
    if knobs.offload_param_buffer_size is not None:
        return int(knobs.offload_param_buffer_size)
    if not plan.largest_param:
        return int(1e8)  # DeepSpeed's default
    return -(-plan.largest_param // max(1, plan.world_size))  # ceil: the largest shard


def offload_block(knobs: Any, target: str, *, params: bool, plan: BatchPlan | None = None) -> dict[str, Any]:
    """The ``offload_optimizer`` (``params`` False) or ``offload_param`` block for ``target`` (cpu / nvme)."""
    block: dict[str, Any] = {"device": target, "pin_memory": knobs.pin_memory}
    if target == "nvme":
        block["nvme_path"] = knobs.nvme_path
        block["buffer_count"] = 5 if params else 4
        if params and plan is not None:
            block["buffer_size"] = param_buffer_size(knobs, plan)
    if not params:
        block["ratio"] = 1.0
    return block


def zero_config(knobs: Any, plan: BatchPlan) -> dict[str, Any]:
    """The ``zero_optimization`` block with every size concrete."""
    hidden_size = plan.hidden_size
    h2 = hidden_size * hidden_size if hidden_size else None

    def size(value: float | None, derived: float | None, default: float) -> int:
        if value is not None:
            return int(value)
        return int(derived) if derived else int(default)

    zero: dict[str, Any] = {"stage": knobs.stage}
    if knobs.tp_size > 1:  # the final save gathers the tensor-parallel shards (accelerate's get_state_dict)
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    if knobs.stage == 0:
        return zero
    zero.update(
        overlap_comm=knobs.overlap_comm,
        contiguous_gradients=knobs.contiguous_gradients,
        reduce_scatter=knobs.reduce_scatter,
        reduce_bucket_size=size(knobs.reduce_bucket_size, h2, 5e8),
        round_robin_gradients=knobs.round_robin_gradients,
        sub_group_size=int(knobs.sub_group_size),
    )
    if knobs.offload_optimizer != "none":
        zero["offload_optimizer"] = offload_block(knobs, knobs.offload_optimizer, params=False)
    if knobs.stage < 3:
        zero["allgather_partitions"] = True
        zero["allgather_bucket_size"] = size(knobs.allgather_bucket_size, h2, 5e8)
        return zero
    zero.update(
        stage3_prefetch_bucket_size=size(knobs.stage3_prefetch_bucket_size, 0.9 * h2 if h2 else None, 5e7),
        stage3_param_persistence_threshold=size(
            knobs.stage3_param_persistence_threshold, 10 * hidden_size if hidden_size else None, 1e5
        ),
        stage3_max_live_parameters=int(knobs.stage3_max_live_parameters),
        stage3_max_reuse_distance=int(knobs.stage3_max_reuse_distance),
        stage3_gather_16bit_weights_on_model_save=knobs.stage3_gather_16bit_weights_on_model_save,
        zero_quantized_weights=knobs.zero_quantized_weights,
        zero_quantized_gradients=knobs.zero_quantized_gradients,
        zero_hpz_partition_size=hpz_partition_size(knobs, plan),
    )
    if knobs.offload_param != "none":
        zero["offload_param"] = offload_block(knobs, knobs.offload_param, params=True, plan=plan)
    return zero


def deepspeed_config(knobs: Any, plan: BatchPlan, device: str = "cuda") -> dict[str, Any]:
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
        "zero_optimization": zero_config(knobs, plan),
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
    if knobs.tp_size > 1:
        config["tensor_parallel"] = model_parallel.autotp_block(knobs.tp_size)
    if knobs.ep_size > 1:
        config["expert_parallel"] = model_parallel.autoep_block(knobs.ep_size, device)
    if knobs.tp_size * knobs.sp_size > 1:
        # DeepSpeed derives it (micro x accumulation x its own count of ranks); a value here would have to
        # be world-based for the HF Trainer's check and data-parallel based for DeepSpeed's, both at once
        del config["train_batch_size"]
    if knobs.communication_data_type:
        config["communication_data_type"] = knobs.communication_data_type
    if "nvme" in (knobs.offload_optimizer, knobs.offload_param):
        config["aio"] = dict(knobs.aio)
    if uses_deepspeed_optimizer(knobs, device, plan.optimizer):
        o = plan.optimizer
        config["optimizer"] = {
            "type": "AdamW",
            "params": {
                "lr": float(o.lr),
                "betas": [float(b) for b in o.betas],
                "eps": float(o.eps),
                "weight_decay": float(o.weight_decay),
                **({} if device == "cuda" else {"torch_adam": True}),  # torch's AdamW: no kernel to build
            },
        }
    return config


def inference_config(knobs: Any, plan: BatchPlan, device: str = "cuda") -> dict[str, Any]:
    """The config of frozen models' engines: the trained model's ZeRO stage and parameter offload,
    no optimizer (so no optimizer offload), no accumulation."""
    config = deepspeed_config(knobs, dataclasses.replace(plan, gradient_accumulation_steps=1), device)
    config.pop("optimizer", None)
    config["zero_optimization"].pop("offload_optimizer", None)
    return config
