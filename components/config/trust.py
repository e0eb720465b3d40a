"""What a shared run dir, experiment file or checkpoint may make hydratune do: by default nothing but data.

Only the user's own command line grants more (:class:`Grants`): ``trust_targets=true`` (trust the whole
config), ``trust_checkpoints=true``, ``model.trust_remote_code=true``, ``hydra.job.env_set.<VAR>=…``, the
lines of a job script (``launcher.setup=[…]``, ``launcher.sbatch_args=[…]``: :data:`COMMANDS`). The
same switches set by a file (an experiment, a ``--config-dir``, a replayed run dir's ``.hydra/``, a sweeper's
parameters) grant nothing: the composition is refused, naming the file and key (exit 2).

- Compositions: every config Hydra composes in the CLI is checked as it is composed
  (:func:`guarded_compositions`), before Hydra configures logging, builds callbacks, sets environment
  variables or launches anything: :func:`check_composed`.
- Checkpoints: before DeepSpeed or transformers open one on resume, every pickled file in it must load with
  ``torch.load(weights_only=True)`` allowing only the types such files hold (:func:`allowed_globals`),
  unless ``trust_checkpoints=true``. DeepSpeed unpickles its states with ``weights_only=False``: a planted
  ``__reduce__`` would run code.
- Configs: every ``_target_`` Hydra would instantiate must be hydratune's own (:data:`OWN`) or sit where a
  recipe names a reward function (:data:`REWARD_KNOBS`, as a partial that instantiation does not call),
  unless ``trust_targets=true``. A reward function must be a plain function taking ``prompts`` and
  ``completions`` (:func:`reward_refusal`): not ``torch.hub.load`` with planted keywords.
- Secrets: ``${oc.env:…}`` of a variable named like a secret (or holding one's value) resolves to
  :data:`REDACTED` (:func:`is_secret`), so no file of a run dir ever holds it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydratune.components.config.errors import ConfigError, yaml_error
from hydratune.components.config.legacy import upgrade

PICKLED = (".pt", ".pth", ".bin", ".pkl", ".pickle", ".ckpt")  # torch.save / pickle output
# never unpickled on resume: transformers saves the TrainingArguments here but does not load them
NEVER_LOADED = ("training_args.bin",)
OWN = ("hydratune.components.", "hydratune.recipes.")  # hydratune's own _target_ namespaces
REWARD_KNOBS = ("recipe.reward", "recipe.reward_funcs")  # user-named reward functions (partials)
#: user-named tools and environments (partials), checked as rewards are: components/tools.py, environment.py
TOOL_KNOBS = ("recipe.tools", "recipe.environment")
REWARD_SIGNATURE = "a reward function is called by keyword with prompts= and completions="
INSTALLED = "an installed package or the standard library, not your code"
SIGNATURE_FIX = "name the completions parameter: def f(prompts, completions, **columns) -> list[float]"
# what Hydra may build from its own node: ours, Hydra's launchers, sweepers and callbacks, Optuna's samplers
HYDRA_TARGETS = (*OWN, "hydra._internal.core_plugins.", "hydra_plugins.", "hydra.experimental.callbacks.")
HYDRA_TARGETS += ("optuna.samplers.", "optuna.pruners.")
LOGGING_CLASSES = ("logging.", "colorlog.", "hydra.", "hydra_plugins.")  # dictConfig class / () factories
LOGGING_STREAMS = ("ext://sys.stdout", "ext://sys.stderr")
LOG_DIRS = ("${hydra.runtime.output_dir}/", "${hydra:runtime.output_dir}/")  # where a log file may be written
SWITCHES = ("trust_targets", "trust_checkpoints", "model.trust_remote_code")
#: knobs whose entries become lines of a generated job script (shell commands, ``#SBATCH`` options)
COMMANDS = ("launcher.setup", "launcher.sbatch_args", "hydra.launcher.setup", "hydra.launcher.srun_args")
#: a word of a variable's name that makes it a secret (``PAT``: a personal access token, ``GITHUB_PAT``) ...
SECRET_WORDS = (
    *("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASS", "PAT", "CREDENTIAL", "CREDENTIALS", "AUTH"),
)
#: ... or its end (``APIKEY``, ``GHTOKEN``, ``DBPASSWORD``): never ``TOKENIZERS_PARALLELISM``
SECRET_ENDINGS = ("KEY", "TOKEN", "SECRET", "PASSWORD")
REDACTED = "<redacted>"


def allowed_globals() -> list[Any]:
    """The non-tensor types checkpoints legitimately hold (found by saving them; torch allows tensors,
    storages and plain containers itself): DeepSpeed ZeRO optimizer states hold the loss scaler (static, or
    dynamic under fp16 — ``CreateLossScaler``), ``ZeroStageEnum`` and ``fragment_address`` (parameter slice
    mappings); transformers' ``rng_state*.pth`` holds numpy's RNG state (transformers allows the same)."""
    import numpy as np

    allowed: list[Any] = [np.ndarray, np.dtype, type(np.dtype(np.uint32))]
    core = getattr(np, "_core", None) or np.core
    allowed.append(core.multiarray._reconstruct)
    try:
        from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
        from deepspeed.runtime.zero.config import ZeroStageEnum
        from deepspeed.utils.tensor_fragment import fragment_address
    except ImportError:  # no DeepSpeed: no DeepSpeed checkpoints to resume
        return allowed
    return [*allowed, LossScaler, DynamicLossScaler, ZeroStageEnum, fragment_address]


def pickled_files(checkpoint: Path) -> list[Path]:
    """Every file under ``checkpoint`` that something would unpickle on resume."""
    return sorted(
        p for p in checkpoint.rglob("*") if p.is_file() and p.suffix in PICKLED and p.name not in NEVER_LOADED
    )


def load_safely(path: Path, allowed: list[Any]) -> None:
    """Unpickle ``path`` allowing tensors and ``allowed`` only (tensor data memory-mapped, not read)."""
    import torch

    with torch.serialization.safe_globals(allowed):
        try:
            torch.load(path, weights_only=True, map_location="cpu", mmap=True)
        except RuntimeError as err:
            if "mmap" not in str(err):
                raise
            torch.load(path, weights_only=True, map_location="cpu")  # an old, non-zip torch file


def check_checkpoint(checkpoint: Path, *, trusted: bool) -> None:
    """Refuse a checkpoint whose pickled files hold anything but tensors and :func:`allowed_globals`."""
    if trusted:
        return
    allowed = allowed_globals()
    for path in pickled_files(checkpoint):
        try:
            load_safely(path, allowed)
        except Exception as err:  # UnpicklingError for a forbidden global; anything else: not loadable
            raise ConfigError(
                f"{path} is not a plain checkpoint file: loading it could run code ({reason(err)})",
                key="trust_checkpoints",
                hint="resume only from checkpoints you trust; pass trust_checkpoints=true for your own",
            ) from None


def reason(err: Exception) -> str:
    """The line of torch's long weights-only error that names the refused global."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()] or [type(err).__name__]
    return next((line for line in lines if "GLOBAL" in line), lines[0])[:200]


# ---- the command line's grants ------------------------------------------------------------------------
@dataclass(frozen=True)
class Grants:
    """What the user's own command line allows: the :data:`SWITCHES` it sets true, the environment
    variables it sets or copies (``hydra.job.env_set.<VAR>=…``, ``hydra.job.env_copy=[…]``)."""

    switches: frozenset[str] = frozenset()
    env: frozenset[str] = frozenset()
    commands: frozenset[str] = frozenset()  # the :data:`COMMANDS` knobs the command line sets itself

    @property
    def everything(self) -> bool:
        """``trust_targets=true``: the user trusts the whole config, whoever wrote it."""
        return "trust_targets" in self.switches

    def allows(self, switch: str) -> bool:
        return self.everything or switch in self.switches


def grants(args: list[str]) -> Grants:
    """The grants of a command line (``hydratune …`` arguments as typed, before replay or resume rewrite
    them)."""
    switches: set[str] = set()
    env: set[str] = set()
    commands: set[str] = set()
    for arg in args:
        key, sep, value = arg.lstrip("+~").partition("=")
        if not sep:
            continue
        if key in COMMANDS:
            commands.add(key)
        elif key in SWITCHES and value.strip().lower() == "true":
            switches.add(key)
        elif key.startswith("hydra.job.env_set."):
            env.add(key.removeprefix("hydra.job.env_set."))
        elif key == "hydra.job.env_copy":
            env.update(name.strip() for name in value.strip("[] ").split(",") if name.strip())
    return Grants(frozenset(switches), frozenset(env), frozenset(commands))


def switch_for(key: str) -> str:
    """The command-line switch that allows what ``key`` does."""
    if key in SWITCHES:
        return f"{key}=true"
    if key.startswith("hydra.job.env_set."):
        return f"{key}=<value> (or trust_targets=true)"
    if key.startswith("hydra.job.env_copy"):
        return "hydra.job.env_copy=[<names>] (or trust_targets=true)"
    if key in COMMANDS:
        return f"{key}=[…] yourself (or trust_targets=true)"
    return "trust_targets=true"


# ---- config targets ---------------------------------------------------------------------------------
def targets(node: Any, prefix: str = "") -> Iterator[tuple[str, str, bool]]:
    """``(key path, _target_, is partial)`` of every node with a ``_target_`` in a plain container."""
    if isinstance(node, dict):
        if "_target_" in node:
            yield prefix or "<root>", str(node["_target_"]), bool(node.get("_partial_", False))
        for key, value in node.items():
            yield from targets(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from targets(value, f"{prefix}[{i}]")


def is_reward_knob(path: str) -> bool:
    """A knob naming user functions Hydra builds as partials: a reward function's or a tool's."""
    return any(path == k or path.startswith((k + ".", k + "[")) for k in (*REWARD_KNOBS, *TOOL_KNOBS))


def reward_refusal(target: str) -> str | None:
    """Why ``target`` (a reward knob's ``_target_`` or dotted name) is not a reward function, or None.

    A reward function is a plain Python function with a ``completions`` parameter that also takes
    ``prompts`` (a parameter or ``**kwargs``): the recipes call it by keyword, ``f(prompts=…,
    completions=…, <column>=…)`` (TRL's GRPO does; so ``def correct(completions, answer, **kw)`` is one).
    Anything else named there (``torch.hub.load``, ``functools.partial``, a class, a builtin) would be
    called with whatever keywords the file bound to it."""
    import inspect

    from hydra.utils import get_method

    try:
        fn = get_method(target)
    except Exception:  # not importable here: the recipe's check resolves it (the user's module dirs added,
        return None  # close matches named) and refuses what is not the user's own plain function

    if not inspect.isfunction(fn):
        return f"is a {type(fn).__name__}, not a plain Python function"
    why = signature_refusal(fn)
    if why and installed_module(fn.__module__):
        return f"{why} ({fn.__module__} is {INSTALLED})"
    return why


def installed_module(module_name: str) -> bool:
    """Whether ``module_name`` comes from the standard library or an installed package (site-packages)."""
    import sys
    import sysconfig

    if module_name.startswith(OWN):
        return False  # hydratune's own, installed or not
    module = sys.modules.get(module_name)
    origin = getattr(module, "__file__", None)
    if origin is None:
        return True  # builtins and namespace oddities: not a user's file
    roots = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    resolved = Path(origin).resolve()
    return any(resolved.is_relative_to(Path(root).resolve()) for root in roots)


def signature_refusal(fn: Callable[..., Any]) -> str | None:
    """Why a plain function cannot be called as a reward (``f(prompts=…, completions=…, <column>=…)``),
    or None."""
    import inspect

    parameters = inspect.signature(fn).parameters
    named = {n for n, p in parameters.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    rest = any(p.kind == p.VAR_KEYWORD for p in parameters.values())
    if "completions" not in named or not ("prompts" in named or rest):
        stars = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}
        shown = ", ".join(stars.get(p.kind, "") + n for n, p in parameters.items())
        return (
            f"takes ({shown}): {REWARD_SIGNATURE} (and the rows' columns), so it takes (prompts, "
            "completions, **columns), or (completions, **kwargs)"
        )
    return None


def reward_specs(config: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """``(key path, value)`` of every reward function a recipe knob names (a node or a dotted name)."""
    recipe = config.get("recipe")
    if not isinstance(recipe, dict):
        return
    if "reward" in recipe:
        yield "recipe.reward", recipe["reward"]
    funcs = recipe.get("reward_funcs")
    for i, spec in enumerate(funcs if isinstance(funcs, list) else []):
        yield f"recipe.reward_funcs[{i}]", spec


def reward_refusals(config: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """``(key, why)`` for each reward knob naming something other than a reward function; a reward model
    (``model:`` set, a path that exists) names no function."""
    for path, spec in reward_specs(config):
        if isinstance(spec, dict) and not spec.get("model") and spec.get("_target_"):
            key, target = f"{path}._target_", str(spec["_target_"])
        elif isinstance(spec, str) and not Path(spec).expanduser().exists():
            key, target = path, spec
        else:
            continue
        why = reward_refusal(target)
        if why:
            yield key, f"{key}={target} {why}"


def target_refusals(config: Any) -> Iterator[tuple[str, str]]:
    """``(key, why)`` for each ``_target_`` outside :data:`OWN` that is not a reward function partial in a
    recipe knob, and each reward knob that names no reward function (:func:`reward_refusal`)."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(config, (DictConfig, ListConfig)):
        config = OmegaConf.to_container(config, resolve=False)
    for path, target, partial in targets(config):
        if target.startswith(OWN) or (partial and is_reward_knob(path)):
            continue
        where = (
            "reward functions and tools must be partials (_partial_: true)"
            if is_reward_knob(path)
            else (
                "only hydratune's own classes (hydratune.components.*, hydratune.recipes.*) and reward "
                "functions are built"
            )
        )
        yield f"{path}._target_", f"{path}._target_={target} is not one of hydratune's: {where}"
    if isinstance(config, dict):
        yield from reward_refusals(config)


def check_targets(config: Any, *, trusted: bool, source: str = "") -> None:
    """Refuse a ``_target_`` outside :data:`OWN` unless it is a reward function partial in a recipe knob;
    ``source`` names the file the config came from."""
    if trusted:
        return
    for key, why in target_refusals(config):
        raise ConfigError(
            f"{source}: {why}" if source else why,
            key=key,
            hint=signature_hint(why)
            or "if you wrote this config (or trust whoever did), pass trust_targets=true",
        )


def check_saved_node(group: str, node: Any, source: Path, *, remote_code: bool) -> None:
    """A run dir's saved ``group:`` node, before it is built outside a composition (``model.from_run``'s
    adapter base, ``export``, ``chat``): hydratune's own ``_target_``s only, nested ones included, and
    ``trust_remote_code`` only when the command line says ``model.trust_remote_code=true``."""
    check_targets({group: node}, trusted=False, source=str(source))
    if isinstance(node, dict) and node.get("trust_remote_code") is True and not remote_code:
        raise ConfigError(
            f"{source}: {group}.trust_remote_code=true (the model dir's Python code would run): only your "
            "command line can grant trust",
            key=f"{group}.trust_remote_code",
            hint=f"if you trust the code of {source.parent.parent}'s model: model.trust_remote_code=true",
        )


# ---- a composed config (Hydra's node included) --------------------------------------------------------
def leaves(node: Any, prefix: str) -> Iterator[tuple[str, str, Any]]:
    """``(key path, key, value)`` of every entry of a plain container, nested ones included."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else []
    for key, value in items:
        path = f"{prefix}.{key}" if isinstance(node, dict) else f"{prefix}[{key}]"
        yield path, str(key), value
        yield from leaves(value, path)


def logging_refusals(node: Any, prefix: str) -> Iterator[tuple[str, str]]:
    """A ``logging.config.dictConfig`` node Hydra applies: only the logging module's classes (colorlog's,
    Hydra's), streams to stdout/stderr, log files in the run dir."""
    for path, key, value in leaves(node, prefix):
        text = str(value)
        if key in ("()", "class") and not text.startswith(LOGGING_CLASSES):
            yield path, f"{path}={text}: logging would import and call it"
        elif text.startswith("ext://") and text not in LOGGING_STREAMS:
            yield path, f"{path}={text}: logging would import it"
        elif key == "filename" and (not text.startswith(LOG_DIRS) or ".." in text):
            yield path, f"{path}={text}: a log file outside the run dir"


def hydra_refusals(hydra: dict[str, Any], granted: Grants) -> Iterator[tuple[str, str]]:
    """What Hydra would do with its own node before hydratune's checks: build callbacks, a launcher and a
    sweeper; configure logging; set environment variables for the run and every process it starts."""
    for group in ("callbacks", "launcher", "sweeper"):
        for path, target, _ in targets(hydra.get(group) or {}, f"hydra.{group}"):
            if not target.startswith(HYDRA_TARGETS):
                yield f"{path}._target_", f"{path}._target_={target}: Hydra would build it before any check"
    for name in ("hydra_logging", "job_logging"):
        yield from logging_refusals(hydra.get(name) or {}, f"hydra.{name}")
    job = hydra.get("job") or {}
    for i, var in enumerate(job.get("env_copy") or []):
        if var not in granted.env:  # copied into env_set, so into .hydra/hydra.yaml: a secret too
            key = f"hydra.job.env_copy[{i}]"
            yield key, f"{key}={var}: copies an environment variable into the run's config and its processes"
    for var in job.get("env_set") or {}:
        if var not in granted.env:  # its value is not repeated: it may be a secret
            key = f"hydra.job.env_set.{var}"
            yield key, f"{key}: sets an environment variable of the run and of every process it starts"


def refusals(cfg: Any, granted: Grants) -> Iterator[tuple[str, str]]:
    """``(key, why)`` of everything in a composed config that runs code and the command line did not
    grant: the trust switches themselves, Hydra's node, the ``_target_``s and reward functions."""
    from omegaconf import OmegaConf

    if granted.everything:
        return
    config = OmegaConf.to_container(cfg, resolve=False)
    assert isinstance(config, dict)
    for switch in SWITCHES:
        if OmegaConf.select(cfg, switch, default=False) is True and not granted.allows(switch):
            code = " (the model dir's Python code would run)" if switch == "model.trust_remote_code" else ""
            yield switch, f"{switch}=true{code}: only your command line can grant trust"
    for key in COMMANDS:
        if OmegaConf.select(cfg, key, default=None) and key not in granted.commands:
            yield key, f"{key} puts commands into the job script it generates"
    yield from hydra_refusals(config.pop("hydra", None) or {}, granted)
    yield from target_refusals(config)


def check_composed(
    cfg: Any, granted: Grants, origin: Callable[[str], str] = lambda key: "the config"
) -> None:
    """Refuse the first of :func:`refusals`, naming the file that set the key (``origin(key)``) and the
    command-line switch that allows it."""
    for key, why in refusals(cfg, granted):
        source = origin(key)
        hint = f"pass {switch_for(key)} on the command line if you wrote {source} or trust whoever did"
        raise ConfigError(f"{source}: {why}", key=key, hint=signature_hint(why) or hint)


def signature_hint(why: str) -> str | None:
    """The fix of a reward refused for its parameters (:func:`signature_refusal`): the parameters, not
    ``trust_targets``."""
    return SIGNATURE_FIX if REWARD_SIGNATURE in why and INSTALLED not in why else None


def origin(loader: Any, config_name: str | None, overrides: list[str], key: str) -> str:
    """The last config file of the composition whose own text sets ``key`` (Hydra's defaults list:
    experiment files, the files their ``defaults:`` name, a replayed ``.hydra/config.yaml``)."""
    from hydra._internal.defaults_list import create_defaults_list
    from omegaconf import OmegaConf

    parsed, repo = loader._parse_overrides_and_create_caching_repo(config_name, overrides)
    found = "the composed config (no file sets it: a sweeper's parameter or hydra.job.env_copy)"
    entries = create_defaults_list(
        repo=repo, config_name=config_name, overrides_list=parsed, prepend_hydra=True, skip_missing=True
    ).defaults
    for entry in entries:
        package = entry.package or ""
        if entry.config_path is None or (package and not (key + ".").startswith(package + ".")):
            continue
        loaded = repo.load_config(entry.config_path)
        relative = key[len(package) + 1 :] if package else key
        if loaded is not None and sets(OmegaConf.to_container(loaded.config, resolve=False), relative):
            root = str(loaded.path).removeprefix("file://")
            found = f"{root}/{entry.config_path}.yaml"
    for override in overrides:  # the command line's overrides come last: they win
        name, sep, _ = override.partition("=")
        name = name.lstrip("+~")
        if sep and "." in name and (key == name or key.startswith((name + ".", name + "["))):  # not a group
            found = f"the command line ({override if len(override) <= 80 else override[:77] + '...'})"
    return found


def sets(node: Any, key: str) -> bool:
    """Whether a plain container has a value at ``key`` (``a.b[0].()``: any key text, no parsing)."""
    for part in re.findall(r"[^.\[\]]+", key):
        if isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            return False
    return node is not None


@contextmanager
def guarded_compositions(granted: Grants) -> Iterator[None]:
    """Check every config Hydra composes in this block (the run's, each sweep point's, ``estimate``'s)
    with :func:`check_composed` as it is composed: before Hydra configures logging, builds callbacks,
    sets ``env_set`` or launches anything. Hydra composes through ``ConfigLoaderImpl.load_configuration``
    (pinned by tests/unit/test_trust_probes.py)."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    original = ConfigLoaderImpl.load_configuration

    def load_configuration(
        self: Any, config_name: str | None, overrides: list[str], *args: Any, **kw: Any
    ) -> Any:
        cfg = upgrade(
            original(self, config_name, overrides, *args, **kw)
        )  # a run dir saved before the namespace
        check_composed(cfg, granted, lambda key: origin(self, config_name, list(overrides), key))
        return cfg

    ConfigLoaderImpl.load_configuration = load_configuration  # type: ignore[method-assign]
    try:
        yield
    finally:
        ConfigLoaderImpl.load_configuration = original  # type: ignore[method-assign]


# ---- secrets ------------------------------------------------------------------------------------------
def is_secret(name: str, value: Any) -> bool:
    """Whether an environment variable read into a config is a secret: its name says so (``*_API_KEY``,
    ``*TOKEN*``, ``*PASSWORD*`` …) or its value is that of a variable whose name does."""
    if secret_name(name):
        return True
    return value not in (None, "") and any(v == value for k, v in os.environ.items() if secret_name(k))


def secret_name(name: str) -> bool:
    """Whether a variable's name says it holds a secret: ``WANDB_API_KEY``, ``HF_TOKEN``,
    ``AWS_SECRET_ACCESS_KEY``, ``MY_PASSWORD``: yes; ``TOKENIZERS_PARALLELISM``: no. The one detector: the
    ``${oc.env:…}`` resolver (:func:`is_secret`), the environment a run dir records and the DeepSpeed
    hostfile launcher's ``.deepspeed_env`` (``components/distributed/hostfile.py``) all ask it."""
    words = [w for w in re.split(r"[^A-Z0-9]+", name.upper()) if w]
    return any(w in SECRET_WORDS or w.endswith(SECRET_ENDINGS) for w in words)


# ---- experiment files a command line names: read before Hydra composes them ------------------------------
def experiment_files(args: list[str]) -> list[Path]:
    """The files ``+experiment=<name>`` (a sweep: ``a,b``) names, in conf/ or a ``--config-dir``."""
    from hydratune import conf

    dirs = [Path(conf.__file__).parent]
    for i, arg in enumerate(args):
        if arg in ("--config-dir", "-cd") and i + 1 < len(args):
            dirs.append(Path(args[i + 1]))
        elif arg.startswith("--config-dir="):
            dirs.append(Path(arg.split("=", 1)[1]))
    names = [
        n for a in args if a.lstrip("+").startswith("experiment=") for n in a.split("=", 1)[1].split(",")
    ]
    found = [d.expanduser() / "experiment" / f"{n.strip()}.yaml" for n in names for d in dirs]
    return [f for f in found if f.is_file()]


def check_file(path: Path) -> None:
    """A config file parses as YAML (trusted or not: trust_targets=true does not skip it): a malformed one
    is named with its line. What it may run is checked once Hydra has composed it
    (:func:`guarded_compositions`)."""
    import yaml
    from omegaconf import OmegaConf

    try:
        OmegaConf.load(path)
    except yaml.YAMLError as err:
        raise yaml_error(err, path) from None


def check_command(args: list[str]) -> None:
    """The experiment files a command line names parse (before Hydra reads them)."""
    for path in experiment_files(args):
        check_file(path)
