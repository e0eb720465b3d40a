"""The command line before Hydra composes it: ``replay <run dir>`` and ``resume=<run dir>`` rewritten into
the Hydra args that compose the run's saved config, an override's value read as Hydra reads it, and Hydra's
own start-up errors (composition, override syntax, YAML, a full disk) named as ConfigErrors."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from hydratune.components.config.errors import ConfigError
from hydratune.components.runtime.hydra_dirs import RunDirCheck


def compose_error(err: Exception) -> ConfigError:
    """Hydra's own composition error (misspelt key, unknown option, wrong type, bad override syntax) as
    a ConfigError naming the key, with the allowed options where Hydra knows them."""
    from hydra.errors import MissingConfigException, OverrideParseException

    if isinstance(err, OverrideParseException):
        return override_syntax_error(err.override, err.message)
    cause = err.__cause__
    key = getattr(cause, "full_key", None) or None
    if isinstance(err, MissingConfigException) and err.missing_cfg_file:
        group, _, option = str(err.missing_cfg_file).rpartition("/")
        options = ", ".join(err.options or [])
        return ConfigError(
            f"unknown option '{option}' for {group or 'the config'}",
            key=group or None,
            hint=f"one of: {options}" if options else "hydratune ls lists the groups and their options",
        )
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    if cause is not None:
        lines += [line.strip() for line in str(cause).splitlines()[:1]]
    hint = "hydratune --cfg job prints the composed config and its keys; +key=value adds a new key"
    return ConfigError("; ".join(lines), key=key, hint=hint)


def override_syntax_error(override: str, message: str) -> ConfigError:
    """An override Hydra's grammar cannot read, named with its key and how to write it: a value with
    characters outside the grammar (non-ASCII, quotes, brackets, ``#``...) goes in Hydra's own quotes, inside
    the shell's; an unclosed list or dict is closed."""
    key, sep, value = override.lstrip("+~").partition("=")
    first = message.strip().splitlines()[0] if message.strip() else "cannot be read"
    if not sep:
        hint = "an override is key=value (+key=value adds a key, ~key removes one)"
    elif value.count("[") != value.count("]") or value.count("{") != value.count("}"):
        hint = f"close the list ({key}=[a,b]) or quote a value that holds brackets: '{key}=\"{value}\"'"
    else:
        escaped = value.replace("\\", "\\\\").replace('"', '\\"')
        hint = f"quote the value for Hydra inside the shell's quotes: '{key}=\"{escaped}\"'"
    return ConfigError(f"the override {override!r} cannot be read: {first}", key=key or None, hint=hint)


def override_value(override: str) -> Any:
    """The value of ``key=value`` as Hydra reads it (its quotes and escapes undone); the raw text when its
    grammar cannot read it (composing then names the problem)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    try:
        return OverridesParser.create().parse_overrides([override])[0].value()
    except OverrideParseException:
        return override.partition("=")[2]


def resumed_run(args: list[str]) -> Path | None:
    """The run dir a ``resume=<run dir or checkpoint dir>`` argument names, when it has a saved config
    (``resume=true`` / ``false`` and sweeps compose as usual)."""
    if any(a in ("-m", "--multirun") or a.startswith("--config") for a in args):
        return None
    paths = [a for a in args if a.startswith("resume=")]
    value = override_value(paths[-1]) if paths else None
    from hydratune.components.runtime.resume import LATEST

    if value in LATEST:
        return pinned_run(args)
    if not isinstance(value, str) or value in ("false", "False", "null"):
        return None
    path = Path(value).expanduser().resolve()
    run = path.parent.parent if path.parent.name == "checkpoints" else path
    return run if (run / ".hydra" / "config.yaml").is_file() else None


def pinned_run(args: list[str]) -> Path | None:
    """``resume=true hydra.run.dir=<dir>`` where ``<dir>`` holds a run: that run is the one to continue
    (in place), as ``resume=<dir>`` would."""
    from hydratune.components.runtime.resume import holds_a_run

    pinned = [override_value(a) for a in args if a.startswith("hydra.run.dir=")]
    if not pinned or not isinstance(pinned[-1], str):
        return None
    run = Path(pinned[-1]).expanduser().resolve()
    return run if holds_a_run(run) and (run / ".hydra" / "config.yaml").is_file() else None


def resume_argv(run: Path, args: list[str]) -> list[str]:
    """``resume=<run>`` continues that run with its own config: the saved one, the overrides given now on
    top (listed on stderr). Overrides the run was started with are in that config already: dropped (a
    ``group=option`` among them could not be applied to a saved config a second time)."""
    from hydratune.components.runtime.multinode import in_place
    from hydratune.components.runtime.resume import LATEST

    saved = run / ".hydra" / "overrides.yaml"
    original = {str(o) for o in OmegaConf.load(saved)} if saved.is_file() else set()
    quoted = str(run).replace("\\", "\\\\").replace('"', '\\"')
    latest = [a for a in args if a.startswith("resume=") and override_value(a) in LATEST]
    args = [f'resume="{quoted}"' if a in latest else a for a in args]  # resume=true: this run (pinned_run)
    others = [a for a in args if a not in original]
    listed = " ".join(a for a in others if not a.startswith("resume=")) or "none"
    print(f"hydratune: continuing {run} with its own config; overrides on top: {listed}", file=sys.stderr)
    return replay_argv([str(run), *others, *in_place(run, others)], label="resume")


def replay_argv(args: list[str], label: str = "replay") -> list[str]:
    """``replay <run dir> [overrides]`` → Hydra args that compose exactly that run's saved config."""
    if not args:
        raise ConfigError(
            "replay needs a run dir", key="replay", hint="hydratune replay outputs/<date>/<run>"
        )
    saved = Path(args[0]).expanduser().resolve() / ".hydra"
    if not (saved / "config.yaml").is_file():
        raise ConfigError(f"{saved / 'config.yaml'} not found: not a run dir", key="replay")
    refuse_group_options(args[1:], label)
    return [
        "--config-path",
        str(saved),
        "--config-name",
        "config",
        f"hydra.run.dir=outputs/${{now:%Y-%m-%d}}/${{now:%H-%M-%S}}_{label}_${{run_tag:}}",
        f"hydra.sweep.dir=multirun/${{now:%Y-%m-%d}}/${{now:%H-%M-%S}}_{label}_${{run_tag:}}",
        # the saved config has no hydra node: its run-dir check (and a multi-node job's .hydra/ rule) added
        f"+hydra.callbacks.run_dir_check._target_={RunDirCheck.__module__}.{RunDirCheck.__qualname__}",
        *args[1:],
    ]


def refuse_group_options(overrides: list[str], label: str) -> None:
    """A saved config has no config groups left to choose from: ``peft=lora`` on top of it cannot pick an
    option (Hydra would put the string "lora" where the peft node was)."""
    from hydratune.components.config.schema import GROUPS

    chosen = [o for o in overrides if "=" in o and o.split("=", 1)[0].lstrip("+~") in GROUPS]
    if not chosen:
        return
    group = chosen[0].split("=", 1)[0].lstrip("+~")
    hint = (
        f"continue it with the {group} it was trained with (drop {chosen[0]}), or start a new run "
        "without resume="
        if label == "resume"
        else f"set that option's keys ({group}.<key>=…), or compose a new run: hydratune {chosen[0]}"
    )
    raise ConfigError(
        f"{label} composes the run's saved config, whose groups are chosen already: {chosen[0]} cannot "
        "pick another option there",
        key=group,
        hint=hint,
    )


def startup_error(err: Exception) -> ConfigError | None:
    """An error Hydra raises while composing or setting up a job that has a name: a malformed YAML file
    (file and line), a disk that is full or a file size limit reached while writing the run dir."""
    import yaml

    from hydratune.components.config.errors import yaml_error
    from hydratune.components.runtime.diskspace import as_disk_full

    if isinstance(err, yaml.YAMLError):
        return yaml_error(err)
    return as_disk_full(err, None)
