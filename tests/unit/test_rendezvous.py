"""The multi-node pieces on their own, in this process (no training): the shared run id, the roll call's
refusals, the race-free run-dir check, per-node keys under resume, a lost peer told apart from other
errors, and DeepSpeed's hostfile checks and environment file. The end-to-end runs are in
tests/multiproc/test_multinode.py."""

from __future__ import annotations

import os
import stat
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from hydratune.components.config.errors import ConfigError
from hydratune.components.distributed.hostfile import (
    Hosts,
    check_hosts,
    environment_file,
    forwarded,
    read_hosts,
    shown,
)
from hydratune.components.distributed.rendezvous import RendezvousError, RollCall, lost_peer
from hydratune.components.launcher import DeepSpeedLauncher, Local, free_port


def test_every_node_derives_one_run_id_from_the_pinned_run_dir() -> None:
    """Both nodes' launchers agree on the rendezvous id without talking (the pinned run dir); an explicit
    ``launcher.run_id`` wins; a run dir made per process is refused for several nodes, naming the fix."""
    node0, node1 = Local(nnodes=2, node_rank=0), Local(nnodes=2, node_rank=1)
    assert node0.rendezvous_id("/shared/runs/a") == node1.rendezvous_id("/shared/runs/a")
    assert node0.rendezvous_id("/shared/runs/a") != node0.rendezvous_id("/shared/runs/b")
    assert Local(nnodes=2, run_id="job-7").rendezvous_id(None) == "job-7"
    with pytest.raises(ConfigError) as refused:
        node0.rendezvous_id(None)
    assert refused.value.key == "hydra.run.dir" and "shared" in str(refused.value)
    assert Local().rendezvous_id(None).startswith("hydratune-")  # one node: any id will do


def cli(*args: str) -> None:
    from hydra.core.global_hydra import GlobalHydra

    from hydratune.recipes.cli import main

    GlobalHydra.instance().clear()
    main(list(args))


def test_plan_with_a_hostfile_and_no_transport_fails_naming_the_fix(tmp_path, capsys, monkeypatch) -> None:
    """``mode=plan`` of a 2-host hostfile on a host without ssh / pdsh: exit 2 before anything starts,
    naming the missing programs and what to install (never DeepSpeed's "worker rank 0 failed")."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=1\n127.0.0.1 slots=1\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))  # neither ssh nor pdsh
    with pytest.raises(SystemExit) as refused:
        cli("mode=plan", "strategy=zero2", "launcher=deepspeed", f"launcher.hostfile={hostfile}")
    err = capsys.readouterr().err
    assert refused.value.code == 2 and "Traceback" not in err
    assert "[launcher.transport]" in err and "ssh and pdsh are not on this host's PATH" in err
    assert "fix: install openssh-client and pdsh here" in err


def test_plan_shows_the_rendezvous_and_refuses_an_unpinned_run_dir(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    job = ["mode=plan", "strategy=ddp", "launcher.nnodes=2", "launcher.node_rank=1"]
    with pytest.raises(SystemExit) as refused:
        cli(*job)
    assert refused.value.code == 2
    assert "[hydra.run.dir]" in capsys.readouterr().err
    cli(*job, f"hydra.run.dir={tmp_path / 'run'}", "launcher.rdzv_timeout=42")
    out = capsys.readouterr().out
    run_id = Local(nnodes=2).rendezvous_id(str(tmp_path / "run"))
    assert f"static, this node is 1 at 127.0.0.1:29500, run id {run_id}" in out
    assert "launcher.rdzv_timeout=42 s" in out and "launcher.collective_timeout=1800 s" in out


def gather_both(calls: list[RollCall]) -> list[Any]:
    """Every node's roll call at once (threads of this process); what each returned or raised."""
    results: list[Any] = [None] * len(calls)

    def join(i: int) -> None:
        try:
            results[i] = calls[i].gather()
        except RendezvousError as err:
            results[i] = err

    threads = [threading.Thread(target=join, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return results


def roll_call(
    tmp_path: Path, port: int, rank: int | None, config: dict, run_dir: Path | None = None
) -> RollCall:
    return RollCall(
        host="127.0.0.1",
        port=port,
        nnodes=2,
        node_rank=rank,
        run_id="test",
        timeout=20,
        run_dir=run_dir or tmp_path,
        config=config,
        say=lambda text: None,
        shared_wait=1,
    )


def test_the_roll_call_names_another_config_and_an_unshared_run_dir(tmp_path: Path) -> None:
    """Two nodes whose configs differ both refuse, naming the key; two nodes that do not see one run dir
    both refuse, naming the filesystem; two nodes that agree both pass (static, and c10d by arrival)."""
    port = free_port()
    other = gather_both(
        [roll_call(tmp_path, port, 0, {"train.seed": 1}), roll_call(tmp_path, port, 1, {"train.seed": 2})]
    )
    for err in other:
        assert isinstance(err, RendezvousError) and "train.seed: 1 → 2" in str(err), err

    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    port = free_port()
    apart = gather_both(
        [roll_call(tmp_path, port, 0, {}, tmp_path / "a"), roll_call(tmp_path, port, 1, {}, tmp_path / "b")]
    )
    for err in apart:
        assert isinstance(err, RendezvousError) and "the nodes do not share it" in str(err), err

    port = free_port()
    agreed = gather_both(
        [roll_call(tmp_path, port, None, {"x": 1}), roll_call(tmp_path, port, None, {"x": 1})]
    )
    assert sorted(r.me.slot for r in agreed) == [0, 1], agreed
    for roster in agreed:
        roster.leave(tmp_path)


def test_the_roll_call_names_a_missing_node_and_a_rank_given_twice(tmp_path: Path) -> None:
    for rank, named in ((0, "node(s) 1 of 2 never joined"), (1, "could not reach the rendezvous")):
        port = free_port()
        alone = roll_call(tmp_path, port, rank, {})
        alone.timeout = 1
        with pytest.raises(RendezvousError) as missing:
            alone.gather()
        assert named in str(missing.value) and f"127.0.0.1:{port}" in str(missing.value)
        assert "launcher.rdzv_timeout" in str(missing.value)
    port = free_port()
    twice = gather_both([roll_call(tmp_path, port, 0, {}), roll_call(tmp_path, port, 0, {})])
    assert any(isinstance(r, RendezvousError) and "launcher.node_rank=0 is taken" in str(r) for r in twice)


def test_each_nodes_own_settings_do_not_block_resume(compose_cfg) -> None:
    """Node 1 resumes node 0's saved run: its launcher.node_rank (and a new master address) are the
    node's own, not a change of what is trained; launcher.nnodes is."""
    from hydratune.components.runtime.resume import differences

    saved = compose_cfg("strategy=ddp", "launcher.nnodes=2")
    node1 = compose_cfg(
        "strategy=ddp", "launcher.nnodes=2", "launcher.node_rank=1", "launcher.master_addr=10.1.1.1"
    )
    assert differences(saved, node1) == []
    assert [d.key for d in differences(saved, compose_cfg("strategy=ddp", "launcher.nnodes=3"))] == [
        "launcher.nnodes"
    ]


def test_a_collective_that_lost_its_peer_is_told_apart() -> None:
    import torch.distributed as dist

    gloo = RuntimeError(
        "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
        "[10.0.0.2]:4567. This is typically caused by a remote worker crashing. GLHF!"
    )
    assert lost_peer(gloo) == "Connection closed by peer [10.0.0.2]:4567"
    wrapped = ValueError("step failed")
    wrapped.__cause__ = dist.DistBackendError("Read error [10.0.0.2]:9: Connection reset by peer")
    assert lost_peer(wrapped) == "Read error [10.0.0.2]:9: Connection reset by peer"
    assert lost_peer(ConnectionResetError("Connection reset by peer")) is None  # not a collective's
    assert lost_peer(RuntimeError("CUDA out of memory")) is None


def test_the_hostfile_is_checked_before_anything_starts(tmp_path: Path, monkeypatch) -> None:
    """A bad line, a host that does not resolve, a missing transport: each named (exit 2 in the CLI).
    One host that is this machine needs no transport, and DeepSpeed is told to skip its ssh check (it
    would need passwordless ssh to localhost)."""
    bad = tmp_path / "bad"
    bad.write_text("node1 gpus=8\n")
    with pytest.raises(ConfigError) as refused:
        read_hosts(str(bad), None)
    assert refused.value.key == "launcher.hostfile" and "bad entry" in str(refused.value)
    with pytest.raises(ConfigError) as unknown:
        check_hosts(Hosts({"localhost": [0], "no-such-host.invalid": [0]}), "pdsh")
    assert "no-such-host.invalid" in str(unknown.value)
    monkeypatch.setenv("PATH", str(tmp_path))  # no ssh, no pdsh
    check_hosts(Hosts({"localhost": [0, 1]}), "pdsh")  # one local host: DeepSpeed launches it directly
    with pytest.raises(ConfigError) as missing:
        check_hosts(Hosts({"localhost": [0], "127.0.0.1": [0]}), "mpich")
    assert missing.value.key == "launcher.transport" and "ssh and mpirun are not on this host's PATH" in str(
        missing.value
    )
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=2\n")
    cmd = DeepSpeedLauncher(hostfile=str(hostfile)).command(tmp_path, free_port)
    assert cmd[:3] == [sys.executable, "-m", "deepspeed.launcher.runner"]  # PATH (emptied above) not asked
    assert "--no_ssh_check" in cmd and "--force_multi" not in cmd  # DeepSpeed would ssh to localhost
    assert cmd[cmd.index("--master_addr") + 1] == "localhost"


def test_the_environment_reaches_the_hosts_through_a_private_file(tmp_path: Path, monkeypatch) -> None:
    """What a run needs (offline flags, tokens, threads, NCCL) goes into a 0600 file of its own (DeepSpeed's
    DS_ENV_FILE), the user's .deepspeed_env after it; a value the runner's command line would mangle is
    left out and named; secrets are never shown; nothing is left behind."""
    env = {
        "HF_HUB_OFFLINE": "1",
        "HF_TOKEN": "hf_secret",
        "OMP_NUM_THREADS": "1",
        "NCCL_SOCKET_IFNAME": "eth0",
        "CUDA_VISIBLE_DEVICES": "0",
        "PYTHONPATH": "/src",
        "PATH": "/venv/bin:/usr/bin",
        "HOME_ALONE": "x",
        "WANDB_NOTES": 'say "hi"',
    }
    picked = forwarded(env)
    assert list(picked) == [
        "HF_HUB_OFFLINE",
        "HF_TOKEN",
        "NCCL_SOCKET_IFNAME",
        "OMP_NUM_THREADS",
        "PATH",  # the same installation on every host: its tools too (a venv's ninja)
        "WANDB_NOTES",
    ]
    assert "hf_secret" not in shown(picked) and "HF_TOKEN (secret)" in shown(picked)
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".deepspeed_env").write_text("OMP_NUM_THREADS=4\n")
    with environment_file(picked) as (path, skipped):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600 and not path.is_relative_to(tmp_path)
        lines = path.read_text().splitlines()
        assert skipped == ["WANDB_NOTES"]
    assert lines == [
        "HF_HUB_OFFLINE=1",
        "HF_TOKEN=hf_secret",
        "NCCL_SOCKET_IFNAME=eth0",
        "OMP_NUM_THREADS=1",
        "PATH=/venv/bin:/usr/bin",
        "OMP_NUM_THREADS=4",  # the user's own file, read last, wins (as DeepSpeed's runner reads it)
    ]
    assert not path.exists() and not path.parent.exists()
    assert os.listdir(tmp_path) == [".deepspeed_env"]


def test_the_trainer_gets_the_collective_timeout() -> None:
    """On GPU transformers makes the process group with ``ddp_timeout``: the launcher's timeout."""
    assert Local(collective_timeout=90).training_args() == {"ddp_timeout": 90}


def test_only_a_multi_node_job_keeps_hydra_from_writing_its_files() -> None:
    """Every node of a multi-node job would write its own .hydra/ (its own launcher.node_rank) as another
    node reads it to resume: Hydra is kept from it (the CLI writes it once, whole); one node, or one
    deepspeed command for every host, keeps Hydra's own."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    from hydratune.components.runtime.multinode import quiet_hydra_files

    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="hydratune.conf", version_base=None):
        for overrides, expected in (
            (["launcher.nnodes=2"], None),
            (["launcher.nnodes=1"], ".hydra"),
            (["launcher=deepspeed", "launcher.nnodes=2"], ".hydra"),
        ):
            cfg = compose(config_name="config", overrides=overrides, return_hydra_config=True)
            quiet_hydra_files(cfg)
            assert cfg.hydra.output_subdir == expected, overrides
    GlobalHydra.instance().clear()
