"""The run dir of a multi-node job under the local launcher, where every node runs the same hydratune
command: the one run dir they share (pinned, never made per process), the run's files written once and
whole (never torn by a node writing as another reads), and what the nodes compare at the roll call."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from hydratune.components.config.errors import ConfigError
from hydratune.components.config.legacy import load_saved

#: resolvers that give every process its own value: a run dir built with one is not shared by the nodes
PER_PROCESS = ("${now:", "${run_tag:")
HYDRA_DIR = ".hydra"


def write_atomically(path: Path, text: str) -> None:
    """``path`` holds ``text`` whole, or what it held before: written to a temp file beside it (a name of its
    own per process: several nodes may write at once), then renamed over it."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def pinned_run_dir() -> str | None:
    """``hydra.run.dir`` when every process that composes this command gets the same one (no ``${now:}``,
    no ``${run_tag:}``); None when it is made per process, or outside a single Hydra run."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode == RunMode.MULTIRUN:
        return None
    run = HydraConfig.get().run
    raw = str(OmegaConf.to_container(run, resolve=False)["dir"])  # type: ignore[index]
    return None if any(marker in raw for marker in PER_PROCESS) else str(run.dir)


def refuse_sweep(launcher: Any) -> None:
    """A multirun of a multi-node job under the local launcher: each node would sweep on its own."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if launcher.nnodes > 1 and HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
        raise ConfigError(
            f"a sweep (-m) of a {launcher.nnodes}-node job under the local launcher: every node would run "
            "the sweep on its own, point by point, with no shared run dir per point",
            key="launcher.nnodes",
            hint="run each point as its own multi-node run (its own pinned hydra.run.dir), or sweep through "
            "SLURM: -m launcher=slurm hydra/launcher=submitit_slurm",
        )


def quiet_hydra_files(config: DictConfig) -> None:
    """In Hydra's ``on_run_start`` of a multi-node job: Hydra writes no ``.hydra/`` (every node would, each
    its own ``launcher.node_rank``, as another node reads it to resume); :func:`save_hydra_files` writes it
    once, whole."""
    from omegaconf import open_dict, read_write

    from hydratune.components.launcher import shared_by_nodes

    if shared_by_nodes(config.launcher):
        with read_write(config.hydra), open_dict(config.hydra):
            config.hydra.output_subdir = None


def save_hydra_files(cfg: DictConfig) -> None:
    """The ``.hydra/`` files Hydra was kept from writing (:func:`quiet_hydra_files`): ``config.yaml`` (``cfg``
    as composed), ``hydra.yaml``, ``overrides.yaml``, each written whole, by the node that writes the run's
    files (node 0; every node of a c10d job, which all hold the same config)."""
    from hydra.core.hydra_config import HydraConfig

    from hydratune.components.config.redact import redacted
    from hydratune.components.launcher import shared_by_nodes

    if not HydraConfig.initialized() or HydraConfig.get().output_subdir is not None:
        return  # Hydra wrote them
    if not shared_by_nodes(cfg.launcher) or int(cfg.launcher.node_rank) != 0:
        return
    hydra_cfg = HydraConfig.instance().cfg
    assert hydra_cfg is not None
    saved = OmegaConf.create(OmegaConf.to_container(hydra_cfg, resolve=False))
    saved.hydra.output_subdir = HYDRA_DIR
    out = Path(HydraConfig.get().runtime.output_dir) / HYDRA_DIR
    out.mkdir(parents=True, exist_ok=True)
    write_atomically(out / "config.yaml", OmegaConf.to_yaml(cfg))
    write_atomically(out / "hydra.yaml", OmegaConf.to_yaml(redacted(saved)))
    write_atomically(out / "overrides.yaml", OmegaConf.to_yaml(redacted(hydra_cfg.hydra.overrides.task)))


def node_config(cfg: DictConfig) -> dict[str, Any]:
    """The resolved config as flat ``key: value`` pairs, without the keys each node sets for itself: what
    every node of a job must share (the roll call compares it)."""
    from hydratune.components.launcher import PER_NODE

    flat: dict[str, Any] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict) and node:
            for key, value in node.items():
                walk(value, f"{prefix}.{key}" if prefix else str(key))
        elif prefix not in PER_NODE:
            flat[prefix] = node

    walk(OmegaConf.to_container(cfg, resolve=True), "")
    return flat


def on_every_node(launcher: Any) -> str:
    """What to add to a resume command that every node of a multi-node job must run."""
    from hydratune.components.launcher import shared_by_nodes

    if not shared_by_nodes(launcher):
        return ""
    own = "" if launcher.get("rdzv_endpoint") else " launcher.node_rank=<its rank>"
    return f"{own} (on every node)"


def resume_note(run_dir: Path, launcher: Any) -> str:
    """After a run failed mid-way: its last whole checkpoint and the command that continues from it
    (``launcher``: the config's launcher node)."""
    from hydratune.components.runtime.checkpoint import checkpoints_in

    whole = checkpoints_in(run_dir)
    if not whole:
        return f". No checkpoint was written in {run_dir} (train.save_every)"
    every = on_every_node(launcher)
    return f". The last whole checkpoint is {whole[-1]}; resume with: hydratune resume={run_dir}{every}"


def in_place(run: Path, overrides: list[str]) -> list[str]:
    """``resume=<run>`` of a multi-node job continues in that run dir (every node must resume into the same
    one; a new timestamped dir would be each node's own), unless ``hydra.run.dir`` is given."""
    import sys

    from hydratune.components.launcher import shared_by_nodes

    saved = load_saved(run / HYDRA_DIR / "config.yaml")
    nodes = [o.split("=", 1)[1] for o in overrides if o.startswith("launcher.nnodes=")]
    launcher = OmegaConf.merge(saved.launcher, {"nnodes": int(nodes[-1])} if nodes else {})
    if not shared_by_nodes(launcher) or any(o.startswith("hydra.run.dir=") for o in overrides):
        return []
    print(
        f"hydratune: a {launcher.nnodes}-node run continues in its own run dir on every node", file=sys.stderr
    )
    return [f"hydra.run.dir={run}"]
