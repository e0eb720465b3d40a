"""Top-level config schema: the groups, plus the plain ``train:`` node every recipe shares."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from hydratune.components.config.ranges import AT_LEAST_ONE, FRACTION, NON_NEGATIVE, SEED, Range, knob

GROUPS: tuple[str, ...] = (
    "recipe",
    "model",
    "data",
    "peft",
    "strategy",
    "precision",
    "quantization",
    "optimizer",
    "scheduler",
    "tracker",
    "launcher",
)


@dataclass
class TrainConfig:
    """What every recipe shares: batch arithmetic, length of training, intervals, seed, outputs."""

    micro_batch_size: int = knob(8, AT_LEAST_ONE)
    gradient_accumulation_steps: int = knob(1, AT_LEAST_ONE)
    epochs: float = knob(1.0, NON_NEGATIVE)
    max_steps: int = knob(  # > 0 overrides epochs
        -1,
        Range(1, also=(-1,)),
        hint="-1 trains for train.epochs; a positive number caps the optimizer steps",
    )
    max_grad_norm: float = knob(1.0, NON_NEGATIVE, hint="train.max_grad_norm=1.0; 0 disables clipping")
    log_every: int = knob(5, AT_LEAST_ONE)  # steps
    eval_every: int = knob(200, NON_NEGATIVE)  # steps; 0 = evaluate at the end only
    save_every: int = knob(500, NON_NEGATIVE)  # steps; 0 = save only the final model
    keep_last: int = knob(2, AT_LEAST_ONE)  # checkpoints kept on disk
    seed: int = knob(42, SEED)
    data_seed: int | None = knob(None, SEED)  # defaults to seed
    # dataloader worker processes; None = auto: 2 on CUDA, 0 on CPU
    num_workers: int | None = knob(None, NON_NEGATIVE)
    count_tokens: bool = True  # num_input_tokens_seen, summed on the device and read at log steps only
    skip_nonfinite_loss: bool = False  # HF's nan/inf loss filter: a device sync every step
    # eval prompts to generate from and score exact-match (0 = off)
    eval_generations: int = knob(32, NON_NEGATIVE)
    max_new_tokens: int = knob(32, AT_LEAST_ONE)
    # training pairs a reward / DPO / KTO / ORPO / SimPO run scores before and after training (0 = off)
    probe_pairs: int = knob(8, NON_NEGATIVE)
    write_plots: bool = True
    deterministic: bool = False


@dataclass
class EstimateConfig:
    """``hydratune estimate`` / ``strategy=auto``: the hardware the memory estimate is checked against."""

    gpu_memory: str = "auto"  # per GPU: "80GB", "24GiB", "80" (GiB); auto = the detected GPU's memory
    num_gpus: int = knob(0, NON_NEGATIVE)  # GPUs per node; 0 = detect (1 when none is visible)
    num_nodes: int = knob(1, AT_LEAST_ONE)
    safety_margin: float = knob(0.1, FRACTION)  # fraction of gpu_memory kept free


@dataclass
class PlanConfig:
    """``mode=plan``: what it prints beside its checks."""

    config: bool = False  # true: the composed config too (resolved), after the data, model and mesh


@dataclass
class Config:
    """The composed run. Groups are typed by their option's own schema (see
    hydratune.components.config.registry)."""

    recipe: Any = MISSING
    model: Any = MISSING
    data: Any = MISSING
    peft: Any = MISSING
    strategy: Any = MISSING
    precision: Any = MISSING
    quantization: Any = MISSING
    optimizer: Any = MISSING
    scheduler: Any = MISSING
    tracker: Any = field(default_factory=dict)  # {name: tracker}: several can be selected at once
    launcher: Any = MISSING
    train: TrainConfig = field(default_factory=TrainConfig)
    estimate: EstimateConfig = field(default_factory=EstimateConfig)
    mode: str = "train"  # train | plan (compose, check, print; no training)
    plan: PlanConfig = field(default_factory=PlanConfig)
    resume: Any = False  # false | true (latest earlier run of this config) | <run dir or checkpoint dir>
    merge: bool = False  # PEFT: also write a merged full model to final/merged
    run_name: str = ""  # shown in summaries and trackers; defaults to the run dir's name
    objective: str = "eval_loss"  # the metric a run returns to Hydra sweepers (Optuna minimises it)
    trust_checkpoints: bool = (
        False  # resume from checkpoints holding arbitrary pickles (components/config/trust.py)
    )
    trust_targets: bool = False  # build _target_s other than hydratune's own and reward functions
    resume_allow_data_change: bool = False  # resume although the data files changed since the checkpoint


ConfigStore.instance().store(name="hydratune_schema", node=Config)
