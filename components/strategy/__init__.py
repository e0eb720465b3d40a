"""Strategy component: how training is spread over devices.

``single`` and ``ddp`` are plain accelerate (``data_parallel.py``); ``zero0``…``zero3pp`` generate a
DeepSpeed config from the composed run (``deepspeed.py``: every ``"auto"`` resolved, see
:meth:`DeepSpeed.deepspeed_config`); ``fsdp`` gives accelerate an FSDP2 plugin, and shards the modules of
loops we own (PPO) with ``fully_shard`` itself (``fsdp.py``, ``components/distributed/fully_shard.py``);
``pipeline`` cuts the model into stages (``pipeline.py``). After the trainer is built,
:meth:`Strategy.verify` checks that accelerate really prepared what was asked for (it falls back silently in
several setups) and refuses to train otherwise; loops are checked by :meth:`OwnLoop.verify_loop`.

``core.py`` holds the interface: :class:`Strategy`, the core every strategy implements, and the extensions
a strategy opts into by subclassing them, :class:`ModelSplit` (the model split over ranks: DeepSpeed, FSDP,
pipeline) and :class:`OwnLoop` (the hooks of the loops we own: single, ddp, FSDP, DeepSpeed). This package
re-exports every class under the ``_target_`` paths ``conf/strategy/`` and saved run dirs name
(``hydratune.components.strategy.DeepSpeed``).
"""

from hydratune.components.strategy.core import (
    DEVICES,
    MULTI_PROCESS,
    WHOLE,
    BatchPlan,
    ModelSplit,
    OwnLoop,
    PreparedLoop,
    Strategy,
    axis_refusal,
    detect_device,
    first_refusal,
    knobs_refusal,
    live_type,
    own_loop_refusal,
    training_options,
)
from hydratune.components.strategy.data_parallel import DDP, Single
from hydratune.components.strategy.deepspeed import (
    AIO_KEYS,
    COMM_DTYPES,
    FROZEN,
    OFFLOAD,
    TP_ZERO3,
    TRAINED,
    ZERO_CHECKPOINT,
    DeepSpeed,
    partition_at_load,
    validate_deepspeed_config,
)
from hydratune.components.strategy.fsdp import FSDP, STATE_DICT_TYPES
from hydratune.components.strategy.parallelism import AXES, Axis, Parallel, ParallelKnobs
from hydratune.components.strategy.pipeline import Pipeline, stages_note, with_stages

__all__ = [
    "AIO_KEYS",
    "AXES",
    "COMM_DTYPES",
    "DDP",
    "DEVICES",
    "FROZEN",
    "FSDP",
    "MULTI_PROCESS",
    "OFFLOAD",
    "STATE_DICT_TYPES",
    "TP_ZERO3",
    "TRAINED",
    "WHOLE",
    "ZERO_CHECKPOINT",
    "Axis",
    "BatchPlan",
    "DeepSpeed",
    "ModelSplit",
    "OwnLoop",
    "Parallel",
    "ParallelKnobs",
    "Pipeline",
    "PreparedLoop",
    "Single",
    "Strategy",
    "axis_refusal",
    "detect_device",
    "first_refusal",
    "knobs_refusal",
    "live_type",
    "own_loop_refusal",
    "partition_at_load",
    "stages_note",
    "training_options",
    "validate_deepspeed_config",
    "with_stages",
]
