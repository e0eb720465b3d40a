"""DeepSpeed's hostfile launcher, checked before anything starts, and the environment it carries to every
host.

``deepspeed --hostfile`` reaches the other hosts through a transport (DeepSpeed's ``--launcher``: pdsh over
ssh by default, or an MPI launcher or SLURM's srun) and first checks passwordless ssh to the first host,
even when that host is this one. When any of it is missing, DeepSpeed's runner fails with a traceback
and no worker ever runs. :func:`check_hosts` (``mode=plan`` and every launch) names what is missing
instead: the transport's programs on this host, a host name that does not resolve. :func:`check_ssh`
(each launch) tries passwordless ssh to every host first.

A host reached through pdsh / mpirun / srun gets the environment of a fresh login, plus the variables the
runner exports itself (``PYTHON*``, ``MLFLOW*``, ``NCCL*`` on CUDA ...) and those listed in a
``.deepspeed_env`` file (runner.py reads it from ``$HOME`` and the working dir, or the file ``DS_ENV_FILE``
names). :func:`environment_file` writes what a run needs there (offline flags, tokens, thread and
NCCL settings, ...) into a private temporary file that is deleted after the run: never into the run dir,
and secrets never printed.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from hydratune.components.config.errors import ConfigError
from hydratune.components.config.scriptvalues import CONTROL, ENV_NAME, check_shell_word, printable
from hydratune.components.config.trust import secret_name

#: DeepSpeed's ``--launcher`` choices → the programs its runner needs on this host (``backend_exists``);
#: every one of them also needs ``ssh`` for the runner's check of the first host
TRANSPORTS: dict[str, tuple[str, ...]] = {
    "pdsh": ("pdsh",),
    "openmpi": ("ompi_info", "mpirun"),
    "mpich": ("mpirun",),
    "impi": ("mpirun",),
    "mvapich": ("mpiname", "mpirun"),
    "slurm": ("sinfo", "srun"),
}
#: Debian / Ubuntu packages that bring a missing program
PACKAGES = {
    "ssh": "openssh-client",
    "pdsh": "pdsh",
    "ompi_info": "openmpi-bin",
    "mpirun": "openmpi-bin (or mpich)",
    "mpiname": "MVAPICH2",
    "sinfo": "slurm-client",
    "srun": "slurm-client",
}
#: the variables a run needs on every host: hub and offline settings, tokens, trackers, threads, the
#: CUDA / NCCL / gloo / torch settings, DeepSpeed's own, hydratune's
FORWARDED = (
    "HF_",
    "HUGGING_FACE_",
    "TRANSFORMERS_",
    "TOKENIZERS_",
    "WANDB_",
    "MLFLOW_",
    "COMET_",
    "OMP_",
    "MKL_",
    "CUDA_",
    "NCCL_",
    "GLOO_",
    "TP_SOCKET_",
    "TORCH_",
    "PYTORCH_",
    "TRITON_",
    "DS_",
    "HYDRATUNE_",
)
#: this host's search paths: DeepSpeed's runner starts this host's python (its absolute path) on every host,
#: so every host is assumed to have the same installation; a login's PATH lacks a virtualenv's bin (its
#: ninja, which DeepSpeed's JIT-built ops need: another ninja version rebuilds them every time)
SEARCH_PATHS = ("PATH", "LD_LIBRARY_PATH", "VIRTUAL_ENV")
#: set per host by DeepSpeed itself, or by the runner (PYTHONPATH: it exports PYTHON* and prepends the dir)
NOT_FORWARDED = ("CUDA_VISIBLE_DEVICES", "DS_ENV_FILE", "PYTHONPATH")
#: what the runner's ``export K=V;`` (in a pdsh / ssh command line) cannot carry intact
UNSAFE = ('"', "$", "`", "\\", "\n")
ENV_FILE = ".deepspeed_env"  # the name runner.py looks for in $HOME and the working dir
#: a host as ssh and pdsh take it: never an option (``-oProxyCommand=…``), never shell text
HOST_NAME = re.compile(r"[A-Za-z0-9_\[][A-Za-z0-9_.:\[\]-]*")


@dataclass(frozen=True)
class Hosts:
    """The hosts of a hostfile that a run uses (after ``include``), with their slots."""

    slots: dict[str, list[int]]

    @property
    def names(self) -> list[str]:
        return list(self.slots)

    @property
    def remote(self) -> bool:
        """Whether any host is not this machine: DeepSpeed reaches them through the transport."""
        return any(not is_this_machine(h) for h in self.slots)

    @property
    def multi(self) -> bool:
        """DeepSpeed's runner takes its multi-node path (the transport) for more than one host; one host
        that is not this machine needs ``--force_multi`` to be reached at all."""
        return len(self.slots) > 1 or self.remote

    def describe(self) -> str:
        return ", ".join(f"{h} ({len(s)} slot{'s' * (len(s) != 1)})" for h, s in self.slots.items())


def read_hosts(hostfile: str, include: str | None) -> Hosts:
    """``hostfile`` parsed by DeepSpeed's runner (``host slots=N`` lines), filtered by ``include``."""
    from deepspeed.launcher.runner import fetch_hostfile, parse_inclusion_exclusion

    try:
        pool = fetch_hostfile(hostfile)
        active = parse_inclusion_exclusion(pool, include or "", "")
    except (ValueError, OSError) as err:
        raise ConfigError(
            f"DeepSpeed cannot use the hostfile {hostfile}: {err}",
            key="launcher.include"
            if include and "not found in hostfile" in str(err)
            else "launcher.hostfile",
            hint="one 'host slots=N' line per host (# comments allowed); launcher.include names its hosts",
        ) from None
    for host in active:
        if not HOST_NAME.fullmatch(host):
            raise ConfigError(
                f"'{printable(host)}' in the hostfile {hostfile} is not a host name: it reaches ssh's and "
                "the transport's command lines",
                key="launcher.hostfile",
                hint="one 'host slots=N' line per host; a host is a name or an address (letters, digits, "
                ". - _ :)",
            )
    return Hosts({host: list(slots) for host, slots in active.items()})


def is_this_machine(host: str) -> bool:
    from torch.distributed.elastic.rendezvous.utils import _matches_machine_hostname

    return bool(_matches_machine_hostname(host))


def check_hosts(hosts: Hosts, transport: str) -> None:
    """Every host resolves, and the programs the transport needs are on this host's PATH (only when
    DeepSpeed takes its multi-node path: one local host runs without them)."""
    unknown = [h for h in hosts.names if not resolves(h)]
    if unknown:
        raise ConfigError(
            f"host(s) {', '.join(unknown)} of the hostfile do not resolve from {socket.gethostname()}",
            key="launcher.hostfile",
            hint="fix the names (or add them to /etc/hosts / DNS); every host must reach every other one",
        )
    if not hosts.multi:
        return
    missing = [p for p in ("ssh", *TRANSPORTS[transport]) if shutil.which(p) is None]
    if missing:
        packages = sorted({PACKAGES[p] for p in missing})
        raise ConfigError(
            f"DeepSpeed reaches the hosts {hosts.describe()} through {transport} over ssh, but "
            f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not on this host's PATH: "
            "no worker could start",
            key="launcher.transport",
            hint=f"install {' and '.join(packages)} here (and an ssh server with this host's key in "
            "~/.ssh/authorized_keys on every host), pick another launcher.transport "
            f"({', '.join(t for t in TRANSPORTS if t != transport)}), or use launcher=local on each node",
        )


def resolves(host: str) -> bool:
    try:
        socket.getaddrinfo(host, None)
    except (socket.gaierror, UnicodeError):
        return False
    return True


def check_ssh(hosts: Hosts, port: int | None, timeout_s: int = 15) -> None:
    """Passwordless ssh reaches every host (what the transport needs), tried at once for all of them."""
    if not hosts.multi:
        return
    base = [
        "ssh",
        "-o",
        "BatchMode=yes",
        "-o",
        f"ConnectTimeout={timeout_s}",
        *(["-p", str(port)] if port else []),
    ]
    tries = {
        host: subprocess.Popen(
            [*base, host, "true"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        for host in hosts.names
    }
    failed = {}
    for host, proc in tries.items():
        try:
            _, err = proc.communicate(timeout=timeout_s + 5)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        if proc.returncode != 0:
            failed[host] = (err.decode(errors="replace").strip().splitlines() or ["no answer"])[-1]
    if failed:
        listed = "; ".join(f"{h}: {why}" for h, why in failed.items())
        raise ConfigError(
            f"passwordless ssh does not reach every host of the hostfile ({listed}): DeepSpeed's transport "
            "needs it, even for this host",
            key="launcher.hostfile",
            hint="put this host's public key in ~/.ssh/authorized_keys on every host (ssh-copy-id) and "
            "accept their host keys once; launcher.ssh_port if sshd listens elsewhere",
        )


def forwarded(environ: dict[str, str] | None = None, paths: bool = True) -> dict[str, str]:
    """The variables of ``environ`` (this process's) that a run needs on every host (``paths``: with
    :data:`SEARCH_PATHS`)."""
    environ = dict(os.environ) if environ is None else environ
    return {
        k: v
        for k, v in sorted(environ.items())
        if (k.startswith(FORWARDED) and k not in NOT_FORWARDED) or (paths and k in SEARCH_PATHS)
    }


def user_env_files() -> list[Path]:
    """The ``.deepspeed_env`` files DeepSpeed's runner would read itself ($HOME, then the working dir)."""
    return [p for p in (Path.home() / ENV_FILE, Path.cwd() / ENV_FILE) if p.is_file()]


def env_lines(variables: dict[str, str]) -> tuple[list[str], list[str]]:
    """(``KEY=value`` lines, names left out because the runner's command line cannot carry their value)."""
    lines, skipped = [], []
    for key, value in variables.items():
        if not ENV_NAME.fullmatch(key) or any(c in value for c in UNSAFE) or CONTROL.search(value):
            skipped.append(key)
        else:
            lines.append(f"{key}={value}")
    return lines, skipped


def user_env_lines(path: Path) -> list[str]:
    """The ``KEY=value`` lines of a user's ``.deepspeed_env``: DeepSpeed's runner writes each as
    ``export KEY="value";`` into the command line every host's shell runs (the key unquoted, the value in
    double quotes), so a line that would be more than one assignment there is refused, naming the file and
    the line."""
    lines = []
    for number, line in enumerate(path.read_text(errors="replace").split("\n"), 1):
        line = line.removesuffix("\r")
        if not line.strip() or line.startswith("#"):
            continue
        key, _, value = line.partition("=")
        plain = ENV_NAME.fullmatch(key) and not any(c in value for c in UNSAFE)
        if not _ or not plain or CONTROL.search(value):
            raise ConfigError(
                f"{path}, line {number}: '{printable(line)}' is not a plain KEY=value line: DeepSpeed's "
                "runner hands it to every host's shell",
                key=str(path),
                hint='one KEY=value per line: a name of letters, digits and _; a value without " $ ` \\',
            )
        lines.append(line)
    return lines


def check_remote_line(run_dir: Path, master_addr: str) -> None:
    """What DeepSpeed's pdsh transport writes unquoted into every host's command line (``cd <cwd>;
    <python> … --master_addr=<addr> … <run dir>``) is plain words."""
    why = "DeepSpeed's pdsh transport writes it unquoted into every host's command line"
    check_shell_word(Path.cwd(), "the working directory", why)
    check_shell_word(sys.executable, "the Python interpreter", why)
    check_shell_word(master_addr, "launcher.master_addr", why)
    check_shell_word(run_dir.resolve(), "hydra.run.dir", why)


def shown(variables: dict[str, str]) -> str:
    """The forwarded names for a log line (no values: secrets among them)."""
    return ", ".join(k + (" (secret)" if secret_name(k) else "") for k in variables) or "none"


@contextmanager
def environment_file(variables: dict[str, str]) -> Iterator[tuple[Path, list[str]]]:
    """A private ``.deepspeed_env`` (mode 0600, in a temporary dir of its own, removed afterwards) with
    ``variables`` and then the lines of the user's own ``.deepspeed_env`` files (they win, as DeepSpeed
    reads them last): yields its path, for ``DS_ENV_FILE``, and the names left out."""
    lines, skipped = env_lines(variables)
    for path in user_env_files():
        lines += user_env_lines(path)
    folder = Path(tempfile.mkdtemp(prefix="hydratune-dsenv-"))  # 0700
    path = folder / ENV_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("".join(line + "\n" for line in lines))
        yield path, skipped
    finally:
        shutil.rmtree(folder, ignore_errors=True)
