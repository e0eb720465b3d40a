"""What every recipe does around its trainer: instantiate the groups, seed, assemble trainer args."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from hydratune.components.config.schema import GROUPS
from hydratune.components.runtime.rundir import RunDir


@dataclass
class Components:
    """The instantiated config groups of one run."""

    recipe: Any
    model: Any
    data: Any
    peft: Any
    strategy: Any
    precision: Any
    quantization: Any
    optimizer: Any
    scheduler: Any
    tracker: Any
    launcher: Any
    #: the strategy option as configured, when the run trains another engine for it: with pipeline stages
    #: (``strategy.pp_size`` > 1) ``strategy`` is the staged engine built from it (``strategy/pipeline.py``
    #: ``with_stages``: its parallel keys and data-parallel side); None: ``strategy`` is the option itself
    configured_strategy: Any = None

    @classmethod
    def from_config(cls, cfg: DictConfig) -> Components:
        """``hydra.utils.instantiate`` each group node (``_target_`` names the component class).

        Keys forced in with ``+group.key=…`` and numbers out of their range (config/ranges.py) are
        rejected first, naming the key, instead of failing inside the component's constructor; so is
        any ``_target_`` that is not hydratune's own or a
        reward function (components/config/trust.py) — a replayed run dir or experiment file sets any key."""
        from hydratune.components.config.ranges import check_values
        from hydratune.components.config.registry import check_known_keys, check_recipe
        from hydratune.components.config.resolvers import check_resolves
        from hydratune.components.config.trust import check_targets
        from hydratune.components.data.images import with_images
        from hydratune.components.strategy import with_stages
        from hydratune.components.tracker import Trackers

        check_resolves(cfg)  # ${oc.env:UNSET} and the like, naming the key
        check_targets(cfg, trusted=bool(cfg.get("trust_targets", False)))
        check_known_keys(cfg)
        check_values(cfg)  # every numeric knob finite and in its declared range (config/ranges.py)
        built = {g: _instantiate(cfg, g) for g in GROUPS}
        check_recipe(built["recipe"])  # everything after reads the recipe's declarations
        # data.images=null follows the model component's accepts_images (components/data/images.py)
        built["data"] = with_images(built["data"], built["model"])
        built["tracker"] = Trackers.of(built["tracker"])
        staged = with_stages(built["strategy"])  # pipeline stages: the engine the run trains with
        configured = built["strategy"] if staged is not built["strategy"] else None
        return cls(**{**built, "strategy": staged}, configured_strategy=configured)

    def items(self) -> list[tuple[str, Any]]:
        """The config groups' components, by group."""
        return [(group, getattr(self, group)) for group in GROUPS]


def _instantiate(cfg: DictConfig, group: str) -> Any:
    """Instantiate one group; a ConfigError raised while building it surfaces as itself."""
    from hydra.errors import InstantiationException
    from omegaconf.errors import InterpolationResolutionError, MissingMandatoryValue

    from hydratune.components.config.errors import ConfigError

    # a data.mixture names its own paths: data.path may be left unset (``???`` in data=jsonl_messages)
    unset = group == "data" and cfg.data.get("mixture") and OmegaConf.is_missing(cfg.data, "path")
    try:
        return instantiate(cfg[group], _convert_="all", **({"path": ""} if unset else {}))
    except MissingMandatoryValue as err:
        raise missing_value(str(err.full_key or group)) from None
    except (InstantiationException, InterpolationResolutionError) as err:
        # omegaconf chains a resolver's exception as __context__, Hydra's as __cause__
        cause = err.__cause__ or err.__context__
        first = cause
        while cause is not None and not isinstance(cause, ConfigError):
            cause = cause.__cause__ or cause.__context__
        if cause is not None:
            raise cause from None
        if "Error locating target" in str(err):
            nested_target_error(cfg[group], group, str(err))
            raise ConfigError(
                f"cannot build {group}: {first or err}",
                key=f"{group}._target_",
                hint=f"pick an option (hydratune ls lists the {group} options) or fix the class path",
            ) from None
        if refused_keys(first):
            raise ConfigError(
                f"cannot build {group}: {first}",
                key=f"{group}._target_",
                hint=f"hydratune --cfg job prints the {group} node; its keys must be the _target_'s fields",
            ) from None
        raise


def nested_target_error(node: Any, group: str, message: str) -> None:
    """When the ``_target_`` Hydra could not locate is one nested in ``group``'s node (a reward function in
    ``recipe.reward_funcs``, a callback...), a ConfigError naming that node's key and the close matches."""
    import re

    from hydratune.components.config.errors import ConfigError
    from hydratune.components.config.trust import is_reward_knob, targets
    from hydratune.components.rewards import import_reward

    found = re.search(r"Error (?:locating target|loading) '([^']+)'", message)
    container = OmegaConf.to_container(node, resolve=False)
    paths = [path for path, target, _ in targets(container) if found and target == found.group(1)]
    if not paths or paths[0] == "<root>":
        return
    key = f"{group}.{paths[0]}._target_"
    if is_reward_knob(f"{group}.{paths[0]}"):
        import_reward(found.group(1), key=key)  # names the module or function missing, and close matches
    raise ConfigError(
        f"cannot locate {found.group(1)} (the _target_ of {group}.{paths[0]})",
        key=key,
        hint="fix the dotted path: module.function or module.Class, importable here",
    )


def refused_keys(cause: BaseException | None) -> bool:
    """The ``_target_``'s constructor refused the node's keys (not a failure inside a component, which
    stays a traceback)."""
    text = str(cause or "")
    return isinstance(cause, TypeError) and (
        "unexpected keyword argument" in text or "required positional argument" in text
    )


#: what to pass for a mandatory key (``???`` in its option) left unset
REQUIRED_HINTS = {
    "data.path": "data.path=<a .jsonl/.json/.parquet/.csv file, a folder of them, or a hub dataset id>",
    "model.name_or_path": "model.name_or_path=<a hub id or a local model dir>",
}


def missing_value(key: str) -> Exception:
    """The ConfigError for a mandatory key the composed config leaves unset."""
    from hydratune.components.config.errors import ConfigError

    return ConfigError(
        f"{key} is required: the selected option has no default for it",
        key=key,
        hint="pass " + REQUIRED_HINTS.get(key, f"{key}=<value>"),
    )


def world_size(comps: Components) -> int:
    """Processes in the job: the external launcher's WORLD_SIZE, else the launcher group's."""
    import os

    return int(os.environ.get("WORLD_SIZE") or comps.launcher.world_size)


def batch_plan(cfg: DictConfig, comps: Components, device: str) -> Any:
    """The one resolved source of batch arithmetic, clipping and precision that the trainer's arguments
    and the generated DeepSpeed config are both built from."""
    import os

    from hydratune.components.strategy import BatchPlan

    try:
        config = comps.model.load_config()
        config = config.get_text_config()  # a vision-language model's decoder (a text model: itself)
        hidden = int(config.hidden_size)
        wide = max(
            int(getattr(config, "vocab_size", 0) or 0), int(getattr(config, "intermediate_size", 0) or 0)
        )
        largest = hidden * wide or None  # the embedding / lm head (or an MLP projection)
    except Exception:  # no config reachable offline: DeepSpeed's default bucket sizes
        config = hidden = largest = None
    dtype, why = comps.precision.choose(device, model_params(config))
    if comps.precision.dtype == "auto" and dtype != "fp32":
        refusal = comps.strategy.device_refusal(device, dtype, comps.recipe.owns_loop)
        if (
            refusal is not None
            and comps.strategy.device_refusal(device, "fp32", comps.recipe.owns_loop) is None
        ):
            dtype, why = "fp32", f"{why}, but strategy {comps.strategy.label} on {device} trains in fp32 only"
    t = cfg.train
    world, split = world_size(comps), comps.strategy.model_split
    return BatchPlan(
        micro_batch_size=t.micro_batch_size,
        gradient_accumulation_steps=t.gradient_accumulation_steps,
        world_size=world,
        max_grad_norm=t.max_grad_norm,
        dtype=dtype,
        dtype_reason=why,
        precision=comps.precision,
        optimizer=comps.optimizer,
        hidden_size=hidden,
        largest_param=largest,
        # a worker knows its node's process count (SLURM sets it per node); else the launcher's
        gpus_per_node=int(os.environ.get("LOCAL_WORLD_SIZE") or comps.launcher.nproc_per_node),
        mesh=comps.strategy.parallel.mesh(world),  # the run's one mesh (strategy/parallelism.py)
        # Ulysses wraps the attention the model is built with (and must be told which)
        attention=comps.model.resolved_attn_implementation() if split.splits_sequences else None,
        architecture=config,
    )


def model_params(config: Any) -> int | None:
    """The parameters of the model ``config`` describes (from its numbers: nothing is built), None when
    they cannot be counted (no config, an architecture the count does not model)."""
    if config is None:
        return None
    from hydratune.components.memory.arch import Arch, param_counts

    try:
        return param_counts(Arch.from_dict(config.to_dict())).total
    except Exception:  # a config without the numbers of a decoder-only transformer
        return None


@dataclass
class RunContext:
    """One run: its config, components, device and run dir."""

    cfg: DictConfig
    components: Components
    run_dir: RunDir
    device: str
    start_time: float = dataclasses.field(default_factory=time.time)
    model: Any = None  # the model being trained, once the recipe has built it
    trainer: Any = None  # the trainer driving it
    _plan: Any = None

    @property
    def train(self) -> Any:
        return self.cfg.train

    @property
    def run_name(self) -> str:
        return self.cfg.run_name or self.run_dir.path.name

    def seed_everything(self) -> None:
        """Seed python, numpy and torch (all devices) from ``train.seed``."""
        from transformers import set_seed

        set_seed(self.cfg.train.seed, deterministic=self.cfg.train.deterministic)

    @property
    def is_main_process(self) -> bool:
        """Rank 0 of the job (the only rank that writes the run dir and talks to trackers)."""
        import os

        return int(os.environ.get("RANK", 0)) == 0

    def record_rank_weights(self, model: Any) -> None:
        """Each rank of a multi-process job notes a fingerprint of its weights (unsharded strategies), so
        'identical weights on every rank' can be checked after the run."""
        import json
        import os

        if self.plan.world_size == 1 or self.components.strategy.shards_parameters:
            return
        rank = int(os.environ.get("RANK", 0))
        path = self.run_dir.path / f".rank{rank}.weights.json"
        path.write_text(json.dumps(weights_fingerprint(model)))

    @property
    def plan(self) -> Any:
        """This run's ``BatchPlan`` (computed once)."""
        if self._plan is None:
            self._plan = batch_plan(self.cfg, self.components, self.device)
        return self._plan

    def training_args(self, **recipe_args: Any) -> dict[str, Any]:
        """TrainingArguments fields from ``train:`` and every component, then the recipe's own."""
        t, c = self.cfg.train, self.components
        args: dict[str, Any] = {
            "output_dir": str(self.run_dir.checkpoints),
            "run_name": self.run_name,
            "per_device_train_batch_size": t.micro_batch_size,
            "per_device_eval_batch_size": t.micro_batch_size,
            "gradient_accumulation_steps": t.gradient_accumulation_steps,
            "num_train_epochs": t.epochs,
            "max_steps": t.max_steps,
            "max_grad_norm": t.max_grad_norm,
            "logging_steps": t.log_every,
            "logging_first_step": True,
            # train.eval_every / save_every: the loop driver decides after each step (runtime/driver.py), the
            # Trainer does what it says (runtime/trainer_loop.py DriverStep): its own strategies stay off
            "eval_strategy": "no",
            "save_strategy": "no",
            "save_total_limit": t.keep_last,
            "seed": t.seed,
            "data_seed": t.data_seed if t.data_seed is not None else t.seed,
            **dataloader_args(t.num_workers, self.device),
            "report_to": c.tracker.report_to(),
            "disable_tqdm": True,
            "include_num_input_tokens_seen": "non_padding" if t.count_tokens else "no",
            "logging_nan_inf_filter": t.skip_nonfinite_loss,
            "average_tokens_across_devices": True,
            **c.model.training_args(self.device),
            **c.strategy.training_args(self.device, self.plan),
            **c.precision.training_args(self.device, self.plan.dtype),
            **c.optimizer.training_args(self.device),
            **c.scheduler.training_args(),
            **c.launcher.training_args(),
        }
        args.update(recipe_args)
        return args

    def resolved_config(self) -> dict[str, Any]:
        return OmegaConf.to_container(self.cfg, resolve=True)  # type: ignore[return-value]

    def overrides(self) -> list[str]:
        """The command-line overrides of this run (empty outside a Hydra job)."""
        from hydra.core.hydra_config import HydraConfig

        if HydraConfig.initialized():
            return list(HydraConfig.get().overrides.task)
        saved = self.run_dir.path / ".hydra" / "overrides.yaml"  # a worker of a launched job
        return list(OmegaConf.load(saved)) if saved.is_file() else []

    def run_info(self) -> Any:
        """What trackers are told: run dir, name, the overrides as tags, the resolved config."""
        from hydratune.components.tracker import RunInfo

        return RunInfo(self.run_dir.path, self.run_name, self.overrides(), self.resolved_config())

    def elapsed(self) -> float:
        return time.time() - self.start_time


def run_recipe(
    cfg: DictConfig, run_dir: Path, comps: Components | None = None, device: str | None = None
) -> Any:
    """Run the recipe in this process (one rank of the job, or the whole job); returns the objective."""
    import os

    from hydratune.components.distributed.group import start_process_group
    from hydratune.components.launcher import single_process_env
    from hydratune.components.runtime.diskspace import disk_errors
    from hydratune.components.runtime.startup import run_ends

    comps = comps or Components.from_config(cfg)
    comps.launcher.rank_env()  # a scheduler's variables (SLURM) as torch.distributed's
    device = device or comps.strategy.resolve_device()
    if comps.strategy.needs_process_group:
        single_process_env()  # DeepSpeed and FSDP want a process group even for one process
    start_process_group(device, comps.launcher.collective_timeout)  # on CPU: ours, with its timeout
    if device == "cuda":
        import torch

        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    ctx = RunContext(cfg=cfg, components=comps, run_dir=RunDir(run_dir), device=device)
    try:
        with disk_errors(run_dir):  # ENOSPC / EFBIG while writing: a named error (runtime/diskspace.py)
            metrics = comps.recipe.run(ctx)
    finally:
        run_ends()  # the run's objects collectable again (a sweep runs its jobs in this process)
    objective = (metrics or {}).get(cfg.objective) if cfg.objective else None
    return float(objective) if isinstance(objective, (int, float)) else metrics  # a scalar for Optuna & co


def dataloader_args(num_workers: int | None, device: str) -> dict[str, Any]:
    """DataLoader settings: ``num_workers`` (None = 2 on CUDA, where collation then overlaps the GPU's
    work, and 0 on CPU, where workers would compete with the training threads), pinned memory on CUDA,
    workers kept alive across epochs."""
    workers = (2 if device == "cuda" else 0) if num_workers is None else num_workers
    return {
        "dataloader_num_workers": workers,
        "dataloader_pin_memory": device == "cuda",
        "dataloader_persistent_workers": workers > 0,
    }


def peak_memory_gb(device: str) -> float:
    """Peak accelerator memory (GiB) on GPU; peak resident set size of this process on CPU: Linux's VmHWM,
    not ``ru_maxrss``, which a process keeps across exec from the process that forked it (a run started by a
    2 GiB parent, a test session, reported 2 GiB whatever it used)."""
    import torch

    if device == "cuda" and torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**30
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 2**20  # KiB
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def weights_fingerprint(model: Any) -> dict[str, Any]:
    """A sha256 of every parameter's bytes (in name order) and their float64 sum."""
    import hashlib

    import torch

    digest, total = hashlib.sha256(), 0.0
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            tensor = param.detach().float().cpu().contiguous()
            digest.update(name.encode())
            digest.update(tensor.numpy().tobytes())
            total += float(tensor.double().sum())
    return {"sha256": digest.hexdigest(), "sum": total}


def hydra_run_dir() -> Path:
    """Hydra's output dir for the running job (the run dir)."""
    from hydra.core.hydra_config import HydraConfig

    return Path(HydraConfig.get().runtime.output_dir)
