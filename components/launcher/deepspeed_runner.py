"""The ``deepspeed`` launcher: DeepSpeed's runner starts every host's processes from a hostfile
(components/distributed/hostfile.py checks it, its hosts and the transport)."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from hydratune.components.config.errors import ConfigError
from hydratune.components.config.ranges import PORT, knob
from hydratune.components.config.registry import component
from hydratune.components.launcher.handoff import Worker, WorkerFailed, clear_markers, finished_ranks
from hydratune.components.launcher.local import Local, inside_launched_worker


@component("launcher")
@dataclass(frozen=True)
class DeepSpeedLauncher(Local):
    """Processes started by DeepSpeed's launcher from a hostfile (``hostfile`` lists ``host slots=N``;
    ``include`` filters it, as ``deepspeed --include``): one command here starts every host's processes
    through ``transport`` (DeepSpeed's ``--launcher``: pdsh over ssh by default). Before anything starts,
    the hostfile, its hosts and the transport are checked (``mode=plan`` too) and passwordless ssh is tried;
    the run's environment reaches every host through a private ``.deepspeed_env``
    (components/distributed/hostfile.py). Every process runs as a worker of the same run dir, which must be
    on a filesystem all hosts share. ``nproc_per_node``: the GPUs per node when no hostfile is given."""

    # null: the hostfile's first host (127.0.0.1 without a hostfile)
    master_addr: str | None = None  # type: ignore[assignment]
    hostfile: str | None = None
    include: str | None = None  # e.g. "node1:0,1@node2" (deepspeed's --include)
    transport: str = (
        "pdsh"  # DeepSpeed's --launcher: pdsh (over ssh) | openmpi | mpich | impi | mvapich | slurm
    )
    ssh_port: int | None = knob(None, PORT)  # DeepSpeed's --ssh_port (pdsh and its ssh check); null = 22

    one_command_per_node: ClassVar[bool] = False  # one deepspeed command starts every node's processes

    def validate(self) -> None:
        from hydratune.components.distributed.hostfile import TRANSPORTS, check_hosts

        super().validate()
        if self.transport not in TRANSPORTS:
            raise ConfigError(
                f"unknown transport '{self.transport}' (DeepSpeed's --launcher)",
                key="launcher.transport",
                hint="one of: " + ", ".join(TRANSPORTS),
            )
        if self.hostfile and not Path(self.hostfile).is_file():
            raise ConfigError(f"hostfile not found: {self.hostfile}", key="launcher.hostfile")
        hosts = self.hosts()
        if hosts is not None and self.spawns_workers():
            check_hosts(hosts, self.transport)

    def spawns_workers(self) -> bool:  # type: ignore[override]
        return not inside_launched_worker()

    def hosts(self) -> Any:
        """The hostfile's hosts that the run uses (``hostfile.Hosts``), or None without a hostfile."""
        from hydratune.components.distributed.hostfile import read_hosts

        return read_hosts(self.hostfile, self.include) if self.hostfile else None

    def describe(self, run_id: str) -> str:
        from hydratune.components.distributed.hostfile import forwarded, shown

        hosts = self.hosts()
        if hosts is None:
            return f"launcher: deepspeed on this host, {self.nproc_per_node} process(es)"
        reach = f"through {self.transport} over ssh" if hosts.multi else "on this host (no transport needed)"
        return (
            f"launcher: deepspeed --hostfile {self.hostfile}: {hosts.describe()} {reach}; every host gets "
            f"{shown(forwarded())}"
            " (+ your .deepspeed_env)"
        )

    def command(self, run_dir: Path, worker: Worker, quiet: bool = False) -> list[str]:
        """The ``deepspeed`` command (an argument list, no shell) running the frozen config's workers: every
        process runs ``worker``'s module (``python -m <module> <run dir>``). DeepSpeed's runner is started by
        this interpreter (``python -m deepspeed.launcher.runner``), so a venv that is not activated (its
        ``deepspeed`` script not on ``PATH``) launches the same installation. ``quiet``: DeepSpeed's runner
        logs no command line (it would show the exported secrets)."""
        hosts = self.hosts()
        cmd = [sys.executable, "-m", "deepspeed.launcher.runner"]
        if hosts is not None:
            cmd += ["--hostfile", str(self.hostfile), "--launcher", self.transport]
            cmd += ["--no_ssh_check"]  # launch() tried every host itself; one local host needs no ssh
            cmd += ["--force_multi"] if hosts.multi and len(hosts.names) == 1 else []  # one remote host
            cmd += ["--ssh_port", str(self.ssh_port)] if self.ssh_port else []
        if self.include:
            cmd += ["--include", self.include]
        if hosts is None:
            cmd += ["--num_nodes", "1", "--num_gpus", str(self.nproc_per_node)]
        master = self.master_addr or (hosts.names[0] if hosts is not None else "127.0.0.1")
        cmd += ["--master_addr", master, "--master_port", str(self.master_port), "--no_local_rank"]
        cmd += ["--log_level", "warning"] if quiet else []
        return [*cmd, "--module", worker.__module__, str(run_dir)]

    def launch(
        self, run_dir: Path, worker: Worker, run_id: str | None = None, config: dict | None = None
    ) -> Any:
        """Check that passwordless ssh reaches every host, then run the ``deepspeed`` command with the run's
        environment for every host in a private ``.deepspeed_env`` (``DS_ENV_FILE``); rank 0's result."""
        import shlex
        import subprocess
        import sys

        from hydratune.components.config.trust import secret_name
        from hydratune.components.distributed.hostfile import (
            check_remote_line,
            check_ssh,
            environment_file,
            forwarded,
            shown,
        )

        hosts = self.hosts()
        if hosts is not None and hosts.multi and self.transport == "pdsh":
            check_remote_line(run_dir, self.master_addr or hosts.names[0])
        if hosts is not None:
            check_ssh(hosts, self.ssh_port)
        clear_markers(run_dir)
        variables = forwarded()
        with environment_file(variables) as (env_file, skipped):
            cmd = self.command(run_dir, worker, quiet=any(secret_name(k) for k in variables))
            print(f"hydratune: {shlex.join(cmd)}", file=sys.stderr, flush=True)
            if hosts is not None and hosts.multi:
                left = f"; left out (the runner's command line cannot carry them): {', '.join(skipped)}"
                print(
                    f"hydratune: every host gets {shown(variables)}{left if skipped else ''}", file=sys.stderr
                )
            proc = subprocess.run(cmd, env={**os.environ, "DS_ENV_FILE": str(env_file)}, check=False)
        done = finished_ranks(run_dir)
        if 0 in done:
            return done[0]
        code = proc.returncode or 1
        reason = f"deepspeed exited with code {code} before rank 0 finished (the output above says why)"
        raise WorkerFailed({0: type("Failure", (), {"exitcode": code})()}, exit_code=code, reason=reason)
