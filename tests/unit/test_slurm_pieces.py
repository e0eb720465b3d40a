"""SLURM's pieces on any machine (no cluster): signal names as sbatch writes them, the job script's knobs
refused before load, a job's tasks as world size and ranks, the pre-emption signal, the submitit launcher
swap, the job script as valid bash, and what survives a job's trip back."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from hydratune.components.config.errors import ConfigError, Interrupted


def slurm_step(monkeypatch: pytest.MonkeyPatch, tasks: int, **more: str) -> None:
    """This process as task 0 of an ``srun`` step of ``tasks`` tasks (torch's variables unset)."""
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(key, "")  # recorded, so what rank_env sets is undone after the test
        monkeypatch.delenv(key)
    step = {
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_STEP_NUM_TASKS": str(tasks),
    }
    for key, value in {**step, "SLURM_JOB_ID": "1234", "SLURM_JOB_NODELIST": "gpu[03-04]", **more}.items():
        monkeypatch.setenv(key, value)


# --- the pieces, on any machine ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("spec", "name"),
    [("USR2", "SIGUSR2"), ("SIGUSR1", "SIGUSR1"), ("B:USR1@90", "SIGUSR1"), ("15", "SIGTERM")],
)
def test_signal_names_as_sbatch_writes_them(spec: str, name: str) -> None:
    from hydratune.components.distributed.slurm import signal_number

    assert signal.Signals(signal_number(spec)).name == name


@pytest.mark.parametrize(
    ("override", "error"),
    [
        ("launcher.signal=USR9", r"\[launcher.signal\] unknown signal 'USR9'"),
        ("launcher.time=4h", r"\[launcher.time\] '4h' is not a SLURM time limit"),
        ("launcher.mem=lots", r"\[launcher.mem\] 'lots' is not a SLURM memory size"),
        (
            "launcher.rdzv_endpoint=n1:29400",
            r"\[launcher.rdzv_endpoint\] launcher=slurm wires the rendezvous",
        ),
    ],
)
def test_a_bad_job_script_knob_is_refused_before_load(compose_cfg, override: str, error: str) -> None:
    from hydratune.components.runtime.checks import check_before_load
    from hydratune.components.runtime.run import Components

    cfg = compose_cfg("launcher=slurm", override)
    with pytest.raises(ConfigError, match=error):
        check_before_load(cfg, Components.from_config(cfg))


def test_a_one_task_job_stays_a_single_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """accelerate takes any LOCAL_RANK for a process group ("MULTI_CPU with 1 process"): 1 task sets none."""
    from hydratune.components.launcher import Slurm

    slurm_step(monkeypatch, 1)
    Slurm().rank_env()
    assert "LOCAL_RANK" not in os.environ and "WORLD_SIZE" not in os.environ
    assert Slurm().world_size == 1 and not Slurm().spawns_workers()


def test_the_world_size_is_the_job_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    from hydratune.components.launcher import Slurm

    slurm_step(monkeypatch, 16, SLURM_PROCID="9", SLURM_LOCALID="1", SLURM_STEP_TASKS_PER_NODE="8(x2)")
    assert (
        Slurm(nproc_per_node=1).world_size == 16
    )  # the config's nproc_per_node is the script's, not the job's
    Slurm().rank_env()
    assert (os.environ["RANK"], os.environ["LOCAL_RANK"], os.environ["WORLD_SIZE"]) == ("9", "1", "16")
    assert os.environ["LOCAL_WORLD_SIZE"] == "8" and os.environ["MASTER_ADDR"] == "gpu03"


def test_the_preemption_signal_is_the_one_the_job_was_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """The job script's ``launcher.signal``; under submitit, submitit's (USR2, SUBMITIT_PREEMPT_SIGNAL) and
    the one ``hydra.launcher.additional_parameters.signal`` makes SLURM send instead."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    from hydratune.components.launcher import Slurm

    assert Slurm().preemption_signals() == frozenset()  # outside a job: nothing is a pre-emption
    slurm_step(monkeypatch, 2)
    assert Slurm().preemption_signals() == {signal.SIGUSR2}
    assert Slurm(signal="USR1").preemption_signals() == {signal.SIGUSR1}
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
    assert Slurm(signal="USR1").preemption_signals() == {signal.SIGUSR2}  # submitit's, not the script's
    monkeypatch.setenv("SUBMITIT_PREEMPT_SIGNAL", "USR1")
    assert Slurm().preemption_signals() == {signal.SIGUSR1}
    monkeypatch.delenv("SUBMITIT_PREEMPT_SIGNAL")
    launcher = {"launcher": {"additional_parameters": {"signal": "USR1@90"}}}
    monkeypatch.setattr(HydraConfig.instance(), "cfg", OmegaConf.create({"hydra": launcher}))
    assert Slurm().preemption_signals() == {signal.SIGUSR1, signal.SIGUSR2}


def test_tasks_of_a_slurm_job_without_launcher_slurm_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two tasks under ``launcher=local`` would each run the whole job into one run dir."""
    from hydratune.components.launcher import Local
    from hydratune.recipes.cli import check_not_under_outside_launcher

    slurm_step(monkeypatch, 2)
    with pytest.raises(ConfigError, match="add launcher=slurm"):
        check_not_under_outside_launcher(SimpleNamespace(launcher=Local()))


def test_submitit_slurm_runs_through_hydratunes_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    """``hydra/launcher=submitit_slurm`` becomes hydratune's subclass when the sweep starts, registered with
    Hydra even where its plugin scan cannot see it (an editable install: simulated by removing it)."""
    from hydra.core.plugins import Plugins
    from omegaconf import OmegaConf

    from hydra_plugins.hydratune.submitit_slurm import SUBMITIT_TARGET, TARGET
    from hydratune.components.runtime.hydra_dirs import wait_for_every_slurm_point

    plugins = Plugins.instance()

    monkeypatch.delitem(plugins.class_name_to_class, TARGET, raising=False)
    config = OmegaConf.create({"hydra": {"launcher": {"_target_": SUBMITIT_TARGET, "nodes": 1}}})
    OmegaConf.set_readonly(config, True)
    wait_for_every_slurm_point(config)
    assert config.hydra.launcher._target_ == TARGET
    registered = plugins.class_name_to_class[TARGET]  # what Hydra instantiates for that target
    assert [f"{c.__module__}.{c.__qualname__}" for c in registered.__mro__[:2]] == [TARGET, SUBMITIT_TARGET]
    local = OmegaConf.create(
        {"hydra": {"launcher": {"_target_": "hydra._internal.core_plugins.basic_launcher"}}}
    )
    wait_for_every_slurm_point(local)  # any other launcher stays as it is
    assert local.hydra.launcher._target_ == "hydra._internal.core_plugins.basic_launcher"


def test_the_job_script_is_complete_and_valid_bash(compose_cfg, tmp_path: Path) -> None:
    from hydratune.components.distributed.slurm import sbatch_script
    from hydratune.components.runtime.run import Components

    knobs = [
        "launcher.nnodes=2",
        "launcher.nproc_per_node=8",
        "launcher.partition=gpu",
        "launcher.account=ml",
    ]
    knobs += ["launcher.time=04:00:00", "launcher.cpus_per_task=12", "launcher.sbatch_args=[--exclusive]"]
    knobs += ["launcher.setup=[module load cuda]"]
    comps = Components.from_config(compose_cfg("launcher=slurm", *knobs))
    script = sbatch_script(comps.launcher, tmp_path, "hydratune.recipes.worker", "job")
    for line in (
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=8",
        "#SBATCH --gpus-per-node=8",  # one GPU per task unless launcher.gpus_per_node says otherwise
        "#SBATCH --cpus-per-task=12",
        "#SBATCH --time=04:00:00",
        "#SBATCH --partition=gpu",
        "#SBATCH --account=ml",
        "#SBATCH --signal=USR2@120",
        "#SBATCH --requeue",
        "#SBATCH --exclusive",
        "module load cuda",
        'export MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
        f"#SBATCH --output={tmp_path.resolve()}/slurm-%j.out",
    ):
        assert line in script.splitlines(), line
    assert script.splitlines()[-1].startswith("srun --kill-on-bad-exit=1 ")
    assert script.splitlines()[-1].endswith(f"-m hydratune.recipes.worker {tmp_path.resolve()}")
    # every #SBATCH line comes before the first command (sbatch stops reading them there)
    lines = script.splitlines()
    first_command = next(i for i, line in enumerate(lines) if line and not line.startswith("#"))
    assert all(i < first_command for i, line in enumerate(lines) if line.startswith("#SBATCH"))
    (tmp_path / "job.sh").write_text(script)
    assert subprocess.run(["bash", "-n", str(tmp_path / "job.sh")], check=False).returncode == 0


def test_a_stopped_runs_error_survives_the_trip_back_from_a_job() -> None:
    """submitit pickles a job's outcome; the submitting hydratune unpickles it."""
    import pickle

    stop = pickle.loads(pickle.dumps(Interrupted(signal.SIGTERM, 12, "/run/checkpoints/checkpoint-12")))
    assert str(stop) == "stopped by SIGTERM at step 12; checkpoint: /run/checkpoints/checkpoint-12"
    assert (stop.signum, stop.step) == (signal.SIGTERM, 12)


def test_continuing_in_place_drops_the_steps_logged_after_the_checkpoint(tmp_path: Path) -> None:
    from hydratune.components.runtime.resume import drop_metrics_after

    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps({"step": s, "loss": 1.0 / s}) + "\n" for s in range(1, 9)))
    drop_metrics_after(metrics, 5)
    assert [json.loads(line)["step"] for line in metrics.read_text().splitlines()] == [1, 2, 3, 4, 5]
