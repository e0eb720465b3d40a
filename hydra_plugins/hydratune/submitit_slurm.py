"""hydra-submitit-launcher's SLURM launcher, waiting for its jobs as hydratune does.

``hydratune -m launcher=slurm hydra/launcher=submitit_slurm`` runs this subclass (RunDirCheck of
components/runtime/hydra_dirs.py swaps it in when the sweep starts; every ``hydra.launcher.*`` knob is the
plugin's): the same submission and the same job, but the sweep waits for every point until it ends, however it
ends, and names the points that failed (components/distributed/slurm_sweep.py). Hydra finds launchers only
under the ``hydra_plugins`` package, hence this module; without hydra-submitit-launcher installed it defines
nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

try:
    from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher as _SubmititSlurm
except ImportError:  # the `slurm` extra is not installed
    _SubmititSlurm = None

#: the plugin's class, as its config names it, and ours
SUBMITIT_TARGET = "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
TARGET = f"{__name__}.SlurmLauncher"

if _SubmititSlurm is not None:

    class SlurmLauncher(_SubmititSlurm):  # type: ignore[misc, valid-type]
        """submitit's SLURM launcher; ``launch`` waits for every point (see the module)."""

        def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Any:
            from hydratune.components.distributed.slurm_sweep import launch

            return launch(self, job_overrides, initial_job_idx)

        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            """A sweep point's job, in its SLURM task: the configs Hydra saves there are redacted too, and
            so is the job's result (submitit pickles it into the sweep dir)."""
            from hydratune.components.config.redact import redacted, redacted_saves

            with redacted_saves():
                result = super().__call__(*args, **kwargs)
            if getattr(result, "hydra_cfg", None) is not None:
                result.hydra_cfg = redacted(result.hydra_cfg)
            return result
