"""Values that reach a generated script or a remote shell's command line, checked for their field.

hydratune writes shell text in three places: ``launcher=slurm``'s job script
(components/distributed/slurm.py), the ``.deepspeed_env`` file DeepSpeed's runner turns into
``export K="V";`` on every host, and the command line DeepSpeed's pdsh transport hands each host's shell
(components/distributed/hostfile.py). Every value is checked here before it is written (a ``ConfigError``
naming its key, exit 2, before any model loads) and quoted where the format allows it: a newline would start
a command of its own (and make ``sbatch`` drop every ``#SBATCH`` line after it), a control character is
never meant.
"""

from __future__ import annotations

import re
from typing import Any

from hydratune.components.config.errors import ConfigError

CONTROL = re.compile(r"[\x00-\x1f\x7f]")
#: an account, partition, QOS, reservation or constraint word as SLURM's tools accept them (no spaces,
#: quotes, shell or list characters); a partition may be a comma list (``gpu,gpu-long``)
SLURM_NAME = r"[A-Za-z0-9_][A-Za-z0-9_.+-]*"
#: a word a remote shell takes as it is: DeepSpeed's pdsh transport writes it unquoted into a command line
SHELL_WORD = re.compile(r"[A-Za-z0-9_./@%+=:,~-]+")
#: an environment variable's name as ``export NAME=…`` takes it
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def printable(value: Any) -> str:
    """``value`` for an error message: control characters escaped, at most 80 characters."""
    text = repr(str(value))[1:-1]
    return text if len(text) <= 80 else text[:77] + "..."


def check_one_line(value: Any, key: str, hint: str | None = None) -> str:
    """``value`` as text without a newline or any other control character, else a ConfigError."""
    text = str(value)
    found = CONTROL.search(text)
    if found:
        raise ConfigError(
            f"'{printable(text)}' holds a control character ({found.group()!r}): it would reach a generated "
            "script, where a newline starts a command of its own",
            key=key,
            hint=hint or f"set {key} without newlines or control characters",
        )
    return text


def check_slurm_name(value: Any, key: str, *, listed: bool = False) -> str:
    """An account / partition / QOS name as SLURM accepts it (``listed``: a comma list of them)."""
    text = check_one_line(value, key)
    pattern = rf"{SLURM_NAME}(,{SLURM_NAME})*" if listed else SLURM_NAME
    if not re.fullmatch(pattern, text):
        raise ConfigError(
            f"'{printable(text)}' is not a SLURM {key.rsplit('.', 1)[-1]} name",
            key=key,
            hint="letters, digits and _ . + - only"
            + (" (several: comma-separated, e.g. gpu,gpu-long)" if listed else "")
            + "; sinfo / sacctmgr show assoc list the names",
        )
    return text


def check_sbatch_option(value: Any, key: str) -> str:
    """One ``#SBATCH`` option (``--exclusive``, ``--constraint=a100``): one line, starting with ``-``."""
    text = check_one_line(value, key)
    if not text.startswith("-") or text.strip() != text:
        raise ConfigError(
            f"'{printable(text)}' is not an sbatch option",
            key=key,
            hint="one option per entry, as sbatch takes it, e.g. launcher.sbatch_args=[--exclusive]",
        )
    return text


def check_shell_word(value: Any, key: str, why: str) -> str:
    """A value a remote shell reads unquoted (``why`` says which): letters, digits and ``_./@%+=:,~-``."""
    text = check_one_line(value, key)
    if not SHELL_WORD.fullmatch(text):
        raise ConfigError(
            f"'{printable(text)}' holds characters a shell would interpret: {why}",
            key=key,
            hint="use letters, digits and _ . / @ % + = : , ~ - only there",
        )
    return text
