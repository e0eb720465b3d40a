"""Strategy component: how training is spread over devices.

``single`` and ``ddp`` are plain accelerate; ``zero0``…``zero3pp`` generate a DeepSpeed config from the
composed run (every ``"auto"`` resolved, see :meth:`DeepSpeed.deepspeed_config`); ``fsdp`` gives
accelerate an FSDP2 plugin, and shards the modules of loops we own (PPO) with ``fully_shard`` itself
(``components/distributed/fsdp.py``). After the trainer is built, :meth:`Strategy.verify` checks that
accelerate really prepared what was asked for (it falls back silently in several setups) and refuses to train
otherwise; loops are checked by :meth:`Strategy.verify_loop`.
"""

from components.strategy.core import (
    DEVICES,
    MULTI_PROCESS,
    BatchPlan,
    PreparedLoop,
    Strategy,
    check_split_sizes,
    detect_device,
    first_refusal,
    live_type,
    training_options,
)
from components.strategy.data_parallel import DDP, Single
from components.strategy.deepspeed import (
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
from components.strategy.fsdp import FSDP, STATE_DICT_TYPES
from components.strategy.pipeline import Pipeline

__all__ = [
    "AIO_KEYS",
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
    "ZERO_CHECKPOINT",
    "BatchPlan",
    "DeepSpeed",
    "Pipeline",
    "PreparedLoop",
    "Single",
    "Strategy",
    "check_split_sizes",
    "detect_device",
    "first_refusal",
    "live_type",
    "partition_at_load",
    "training_options",
    "validate_deepspeed_config",
]
