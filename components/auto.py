"""``strategy=auto``: pick the strategy that fits, from the memory estimate, before anything loads.

The choice walks the OOM ladder of :mod:`hydratune.components.memory.ladder` over every strategy option in
conf/strategy/ (each with the memory shape and mesh its component declares) and, for options that declare
mesh dimensions (``Strategy.searched_axes``), their tensor / sequence / pipeline parallel sizes; in the
documented order (data parallel on the GPUs, then tp / sp / pp, then offload; inside each the ASSUMED,
unmeasured speeds of ``components/memory/shapes.py``), it takes the first (layout, gradient checkpointing)
rung whose micro-batch-1 run fits the GPU with the safety margin, then the largest micro-batch that still
fits with gradient accumulation keeping the global batch. The chosen overrides
(``strategy=zero1 strategy.tp_size=4``, the batch split) compose the node that replaces ``strategy``, and
the run dir's ``.hydra/config.yaml`` is rewritten, so ``hydratune replay <run dir>`` replays the decision
without ``auto``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from omegaconf import DictConfig, OmegaConf, open_dict

from hydratune.components.config.errors import ConfigError
from hydratune.components.config.registry import component
from hydratune.components.memory.shapes import SINGLE, StrategyShape


@component("strategy")
@dataclass(frozen=True)
class Auto:
    """Chosen at launch from the memory estimate (``estimate.*`` says the hardware); never trains itself."""

    device: str = "auto"
    candidates: list[str] = field(default_factory=list)  # restrict the ladder (empty = every option)
    tune_micro_batch: bool = True  # also pick the micro-batch (false: keep train.micro_batch_size)
    decided: ClassVar[bool] = False  # the engine is not known before launch (the estimate reads this)

    def validate(self) -> None:
        from hydratune.components.strategy import training_options

        known = training_options()
        unknown = [c for c in self.candidates if c not in known]
        if unknown:
            raise ConfigError(
                f"unknown strategy candidates {unknown}",
                key="strategy.candidates",
                hint=f"choose from {', '.join(known)}",
            )

    def memory_shape(self, gpus_per_node: int = 8) -> StrategyShape:
        """Undecided until launch: the estimate of the run as configured counts one process."""
        return SINGLE

    @property
    def parallel(self) -> Any:
        """Undecided until launch: the estimate of the run as configured splits nothing (one ``Parallel`` of
        ones: every axis 1)."""
        from hydratune.components.strategy import Parallel

        return Parallel()

    @property
    def model_split(self) -> Any:
        """Undecided until launch: the estimate of the run as configured is data parallel only (a whole model
        on every rank: ``hydratune.components.strategy.WHOLE``)."""
        from hydratune.components.strategy import WHOLE

        return WHOLE

    def resolve_device(self) -> str:
        from hydratune.components.strategy import detect_device

        return detect_device(self.device)


def is_auto(cfg: Any) -> bool:
    """True when the composed config's strategy is ``auto`` (its node names this module's ``Auto``)."""
    target = OmegaConf.select(cfg, "strategy._target_", default="") if isinstance(cfg, DictConfig) else ""
    return str(target) == f"{Auto.__module__}.{Auto.__qualname__}"


def compose_strategy_hydra(choice: list[str]) -> DictConfig:
    """The composed strategy node of ``choice`` (``["strategy=zero1", "strategy.tp_size=4"]``), with the
    running job's other overrides (Hydra's compose API)."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    overrides: list[str] = []
    try:
        from hydra.core.hydra_config import HydraConfig

        overrides = [o for o in HydraConfig.get().overrides.task if not o.lstrip("+~").startswith("strategy")]
    except ValueError:  # not inside a Hydra job
        pass
    overrides += choice
    if GlobalHydra.instance().is_initialized():
        return compose(config_name="config", overrides=overrides).strategy
    with initialize_config_module(config_module="hydratune.conf", version_base=None):
        node = compose(config_name="config", overrides=overrides).strategy
    GlobalHydra.instance().clear()
    return node


def decide(cfg: Any, spec: Any, gpu_memory: float, margin: float) -> Any:
    """The ladder's :class:`~hydratune.components.memory.ladder.Decision` for the composed ``cfg`` (``spec``:
    its
    estimate's RunSpec): the per-GPU batch to keep, ``strategy.candidates`` and ``tune_micro_batch``."""
    from hydratune.components.memory.ladder import choose
    from hydratune.components.memory.spec import get, strategy_rungs

    train, strategy = get(cfg, "train"), get(cfg, "strategy")
    micro = int(get(train, "micro_batch_size", 1))
    tune = bool(get(strategy, "tune_micro_batch", True))
    return choose(
        spec,
        strategy_rungs(spec),
        gpu_memory,
        margin,
        micro * int(get(train, "gradient_accumulation_steps", 1)),
        candidates=list(get(strategy, "candidates", []) or []) or None,
        micro_batch=None if tune else micro,
    )


def resolve_auto(
    cfg: DictConfig, compose_strategy: Callable[[list[str]], DictConfig] | None = None
) -> tuple[DictConfig, str]:
    """(the config with ``strategy`` and the batch split chosen, the decision in words). The strategy node
    is what the chosen overrides compose to (``strategy=zero1 strategy.tp_size=4``): the run dir replays
    it."""
    from hydratune.components.memory.spec import get, gpu_memory_of, spec_from_config

    gpu_memory = gpu_memory_of(cfg)
    if gpu_memory is None:
        raise ConfigError(
            "strategy=auto needs to know the GPU memory and no GPU is visible",
            key="estimate.gpu_memory",
            hint="pass estimate.gpu_memory=80GB (and estimate.num_gpus=8), or pick a strategy",
        )
    decision = decide(cfg, spec_from_config(cfg), gpu_memory, float(cfg.estimate.safety_margin))
    text = decision.explain()
    if decision.strategy is None:
        raise ConfigError(f"no strategy fits:\n{text}", key="strategy", hint="see the table above")
    strategy_overrides = [o for o in decision.overrides if o.startswith("strategy")]
    node = (compose_strategy or compose_strategy_hydra)(strategy_overrides)
    new = cfg.copy()
    with open_dict(new):
        device = get(cfg.strategy, "device", "auto")
        new.strategy = node
        if "device" in new.strategy:
            new.strategy.device = device
        new.model.gradient_checkpointing = decision.gradient_checkpointing
        new.train.micro_batch_size = decision.micro_batch
        new.train.gradient_accumulation_steps = decision.accumulation
    return new, text


def maybe_resolve_auto(cfg: DictConfig) -> DictConfig:
    """In the CLI, before the groups are instantiated: resolve ``strategy=auto``, print why, and rewrite
    the run dir's saved config with the choice. Any other strategy passes through untouched."""
    if not is_auto(cfg):
        return cfg
    new, text = resolve_auto(cfg)
    print(text)
    save_choice(new)
    return new


def save_choice(cfg: DictConfig) -> None:
    """Rewrite the run dir's saved config (``.hydra/config.yaml``) with a strategy chosen at launch, so the
    run dir replays the choice (nothing outside a Hydra job)."""
    try:
        from pathlib import Path

        from hydra.core.hydra_config import HydraConfig

        saved = Path(HydraConfig.get().runtime.output_dir) / ".hydra" / "config.yaml"
        if saved.parent.is_dir():
            OmegaConf.save(cfg, saved)
    except ValueError:  # not inside a Hydra job (tests)
        pass
