"""The allowed values of every numeric knob, declared in one table and checked before anything is built.

OmegaConf checks a knob's type (``int``, ``float``) when the config is composed, not its value: ``nan``,
``inf`` and ``-1`` are floats and ints like any other. :data:`RANGES` gives each numeric field of the
structured configs (the shared ``train:`` / ``estimate:`` nodes, every component, every recipe) its range;
:func:`check_values` walks the composed config and refuses, naming the key and the range, any value outside
it, and any non-finite float. A knob is looked up as ``<group>.<field>`` first, then by its field name
alone (a name means the same thing in every group that has it). ``tests/test_value_probes.py`` fails
when a numeric knob has no entry here, so a new knob cannot skip the check.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from components.config.errors import ConfigError

SEED_MAX = 2**32 - 1  # numpy's and torch's seeds


@dataclass(frozen=True)
class Range:
    """``low <= value <= high`` (``<`` where open), a finite number; ``also``: sentinels outside it."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    also: tuple[float, ...] = ()

    def allows(self, value: float) -> bool:
        if value in self.also:
            return True
        if not math.isfinite(value):
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def __str__(self) -> str:
        parts = []
        if self.low is not None:
            parts.append(f"{'>' if self.low_open else '>='} {self.low:g}")
        if self.high is not None:
            parts.append(f"{'<' if self.high_open else '<='} {self.high:g}")
        text = " and ".join(parts) or "any"
        text = f"a finite number {text}" if parts else "any finite number"
        return text + "".join(f", or {v:g}" for v in self.also)


FINITE = Range()
POSITIVE = Range(0, low_open=True)  # > 0
NON_NEGATIVE = Range(0)  # >= 0
AT_LEAST_ONE = Range(1)
FRACTION = Range(0, 1, high_open=True)  # [0, 1)
UNIT = Range(0, 1)  # [0, 1]
SEED = Range(0, SEED_MAX)

#: ``<group>.<field>`` or ``<field>`` -> its range (every numeric knob of conf/'s schemas has one)
RANGES: dict[str, Range] = {
    # train: (components/config/schema.py)
    "train.micro_batch_size": AT_LEAST_ONE,
    "train.gradient_accumulation_steps": AT_LEAST_ONE,
    "train.epochs": NON_NEGATIVE,
    "train.max_steps": Range(1, also=(-1,)),  # -1: train for train.epochs
    "train.max_grad_norm": NON_NEGATIVE,
    "train.log_every": AT_LEAST_ONE,
    "train.eval_every": NON_NEGATIVE,
    "train.save_every": NON_NEGATIVE,
    "train.keep_last": AT_LEAST_ONE,
    "seed": SEED,
    "train.data_seed": SEED,
    "train.num_workers": NON_NEGATIVE,
    "train.eval_generations": NON_NEGATIVE,
    "max_new_tokens": AT_LEAST_ONE,
    # estimate:
    "estimate.num_gpus": NON_NEGATIVE,
    "estimate.num_nodes": AT_LEAST_ONE,
    "estimate.safety_margin": FRACTION,
    # strategy
    "bucket_cap_mb": POSITIVE,
    "strategy.stage": Range(0, 3),
    "reduce_bucket_size": POSITIVE,
    "allgather_bucket_size": POSITIVE,
    "stage3_prefetch_bucket_size": NON_NEGATIVE,
    "stage3_param_persistence_threshold": NON_NEGATIVE,
    "stage3_max_live_parameters": POSITIVE,
    "stage3_max_reuse_distance": NON_NEGATIVE,
    "sub_group_size": POSITIVE,
    "zero_hpz_partition_size": AT_LEAST_ONE,
    "offload_param_buffer_size": POSITIVE,
    "tp_size": AT_LEAST_ONE,  # tensor parallel ranks; the mesh check wants it to divide the world
    "sp_size": AT_LEAST_ONE,  # sequence / context parallel ranks
    "strategy.pp_size": Range(2),  # pipeline: 1 stage would be no pipeline
    "stages_per_rank": AT_LEAST_ONE,
    "strategy.split": AT_LEAST_ONE,  # each a layer index that starts a stage
    # data
    "eval_fraction": FRACTION,
    "eval_size": NON_NEGATIVE,
    "max_samples": AT_LEAST_ONE,
    "max_length": AT_LEAST_ONE,
    "max_prompt_length": AT_LEAST_ONE,
    "stream_window": AT_LEAST_ONE,
    "num_proc": AT_LEAST_ONE,  # data.num_proc (null: the cores available)
    # launcher
    "nproc_per_node": AT_LEAST_ONE,
    "nnodes": AT_LEAST_ONE,
    "node_rank": NON_NEGATIVE,
    "master_port": Range(1, 65535),
    "rdzv_timeout": POSITIVE,  # seconds
    "collective_timeout": POSITIVE,  # seconds
    "ssh_port": Range(1, 65535),
    "max_restarts": NON_NEGATIVE,
    "launcher.gpus_per_node": NON_NEGATIVE,  # launcher=slurm's job script
    "launcher.cpus_per_task": AT_LEAST_ONE,
    "launcher.signal_delay_s": NON_NEGATIVE,
    # optimizer
    "lr": POSITIVE,
    "weight_decay": NON_NEGATIVE,
    "betas": FRACTION,  # each of the two
    "eps": POSITIVE,
    "clip_threshold": POSITIVE,
    "decay_rate": Range(-1, 0, high_open=True),  # Adafactor: 1 - t^decay_rate
    "beta1": FRACTION,
    "momentum": FRACTION,
    "optimizer.bits": Range(8, 32),  # 8 | 32: the component says which
    # peft
    "last_n_layers": AT_LEAST_ONE,
    "r": AT_LEAST_ONE,
    "alpha": POSITIVE,
    "dropout": FRACTION,
    "num_virtual_tokens": AT_LEAST_ONE,
    "encoder_hidden_size": AT_LEAST_ONE,
    # precision
    "loss_scale": NON_NEGATIVE,  # 0 = dynamic
    "initial_scale_power": Range(0, 64),
    "loss_scale_window": AT_LEAST_ONE,
    "hysteresis": AT_LEAST_ONE,
    "min_loss_scale": POSITIVE,
    # quantization
    "quantization.bits": Range(4, 8),  # 4 | 8: the component says which
    "int8_threshold": NON_NEGATIVE,
    # scheduler
    "warmup_steps": NON_NEGATIVE,
    "warmup_ratio": FRACTION,
    "min_lr_ratio": FRACTION,
    # recipes
    "temperature": NON_NEGATIVE,
    "top_p": Range(0, 1, low_open=True),
    "top_k": NON_NEGATIVE,
    "num_return_sequences": AT_LEAST_ONE,
    "batch_size": AT_LEAST_ONE,
    "beta": NON_NEGATIVE,
    "loss_weights": FINITE,  # each
    "label_smoothing": Range(0, 0.5),
    "limit": POSITIVE,  # lm-eval: a fraction < 1 or a number of examples
    "num_fewshot": NON_NEGATIVE,
    "steps": AT_LEAST_ONE,
    "num_generations": AT_LEAST_ONE,
    "max_completion_length": AT_LEAST_ONE,
    "epsilon": POSITIVE,
    "num_iterations": AT_LEAST_ONE,
    "reward_weights": FINITE,  # each
    "rollout_batch_size": AT_LEAST_ONE,
    "ppo_epochs": AT_LEAST_ONE,
    "mini_batch_size": AT_LEAST_ONE,
    "response_length": AT_LEAST_ONE,
    "gamma": UNIT,
    "desirable_weight": NON_NEGATIVE,  # KTO's weight of the desirable rows' loss
    "undesirable_weight": NON_NEGATIVE,
    "sft_weight": NON_NEGATIVE,  # SimPO's NLL term (TRL's cpo_alpha)
    "reward_timeout": Range(low=0, low_open=True),  # seconds a reward_url call may take
    "reward_retries": Range(low=0),
    "lam": UNIT,
    "clip_ratio": POSITIVE,
    "value_clip": POSITIVE,
    "vf_coef": NON_NEGATIVE,
    "entropy_coef": NON_NEGATIVE,
    "kl_coef": NON_NEGATIVE,
    "target_kl": POSITIVE,
    "kl_horizon": AT_LEAST_ONE,
    "reward_clip": POSITIVE,
    "missing_eos_penalty": FINITE,
    "center_rewards_coefficient": NON_NEGATIVE,
}


def range_of(group: str, name: str) -> Range | None:
    """The declared range of knob ``name`` of ``group`` (None: not declared)."""
    return RANGES.get(f"{group}.{name}", RANGES.get(name))


def is_numeric(hint: Any) -> bool:
    """An ``int`` / ``float`` knob, optional or not, or a list of them (``bool`` is not a number here)."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (list, tuple):
        return bool(args) and all(is_numeric(a) for a in args)
    if args:
        return all(is_numeric(a) for a in args)
    return hint in (int, float)


def numeric_fields(schema: type) -> Iterator[tuple[str, Any]]:
    """The numeric knobs of a structured-config dataclass: (name, type hint)."""
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        if f.init and not f.name.startswith("_") and is_numeric(hints[f.name]):
            yield f.name, hints[f.name]


def check_value(group: str, name: str, value: Any) -> None:
    """Refuse ``value`` for knob ``<group>.<name>`` unless it is in its range (None = unset: allowed)."""
    if value is None:
        return
    if isinstance(value, (list, tuple, ListConfig)):
        for item in value:
            check_value(group, name, item)
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return  # an interpolation or a type OmegaConf let through: not a number to judge here
    allowed = range_of(group, name) or FINITE
    if not allowed.allows(value):
        raise ConfigError(
            f"must be {allowed}, got {value}",
            key=f"{group}.{name}",
            hint=f"pass {group}.{name}=<{allowed}>",
        )


def config_nodes(cfg: DictConfig) -> Iterator[tuple[str, DictConfig]]:
    """(path, node) of every structured node of a composed config: the groups, ``train``, ``estimate``,
    each selected tracker."""
    from components.config.schema import GROUPS

    for group in ("train", "estimate", *GROUPS):  # first: the groups' knobs interpolate ${train.seed}
        node = cfg.get(group)
        if group == "tracker":
            yield from (("tracker", t) for t in (node or {}).values() if isinstance(t, DictConfig))
        elif isinstance(node, DictConfig):
            yield group, node


def check_values(cfg: DictConfig) -> None:
    """Every numeric knob of the composed config within its declared range (:data:`RANGES`), finite."""
    for group, node in config_nodes(cfg):
        schema = OmegaConf.get_type(node)
        if not dataclasses.is_dataclass(schema):
            continue
        for name, _ in numeric_fields(schema):
            if name in node:
                check_value(group, name, node[name])
