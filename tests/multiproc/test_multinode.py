"""Several nodes, for real: two "nodes" on 127.0.0.1, each a hydratune command with one process
(``launcher.nnodes=2``), side by side in one pinned run dir, as docs/multinode.md's commands run them;
and DeepSpeed's hostfile launcher over a real sshd. The oracle is a one-node 2-process run with the same
seed and overrides: on CPU the final weights are equal bit for bit.

The oracles are the support matrix's sft-ddp and sft-zero2 cells (tests/multiproc/test_cells.py launches
each once per session; ``cells`` gives their run dirs): the nodes run the same overrides, on one process
each. The static rendezvous' SIGTERM run, resumed, ends with the DDP cell's weights; the c10d run and the
hostfile run with the ZeRO-2 cell's.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file

from hydratune.components.commands.matrix import Cell
from hydratune.components.config.errors import EXIT_INTERRUPTED, EXIT_NODE_LOST
from hydratune.components.launcher import free_port
from hydratune.components.runtime.checkpoint import checkpoints_in, verify
from tests.support.cells import FORK, command
from tests.support.cli import TIMEOUT, finish, finish_all, kill_mentioning, start, wait_for_step

DDP, ZERO2 = Cell("sft", "ddp", "none", "none", "fp32"), Cell("sft", "zero2", "none", "none", "fp32")


def node_command(cell: Cell, root: Path) -> list[str]:
    """The cell's overrides for one node of two (one process each: the same 2 ranks as the cell's one
    node of 2 processes)."""
    return [o for o in command(cell, root) if not o.startswith("launcher.nproc_per_node=")]


def two_nodes(cwd: Path, run: Path, rendezvous: list[str], *overrides: str) -> list[subprocess.Popen[str]]:
    """Node 0 and node 1 of one job: the same command, side by side (a static rendezvous also gives each
    its ``launcher.node_rank``)."""
    # rdzv_timeout: long enough for the second node's start-up on a loaded machine, short for a failure
    common = [
        *overrides,
        "launcher.nnodes=2",
        "launcher.rdzv_timeout=120",
        *rendezvous,
        f"hydra.run.dir={run}",
    ]
    static = not any(r.startswith("launcher.rdzv_endpoint=") for r in rendezvous)
    return [start(cwd, *common, *([f"launcher.node_rank={rank}"] if static else [])) for rank in (0, 1)]


def static_at(port: int) -> list[str]:
    return ["launcher.master_addr=127.0.0.1", f"launcher.master_port={port}"]


def c10d_at(port: int) -> list[str]:
    return [f"launcher.rdzv_endpoint=127.0.0.1:{port}"]


def weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(run / "final" / "model.safetensors")


def assert_bit_identical(run: Path, reference: Path) -> None:
    got, expected = weights(run), weights(reference)
    assert got.keys() == expected.keys()
    for key in expected:
        assert torch.equal(got[key], expected[key]), key


def one_run_dir(cwd: Path, run: Path) -> None:
    """Nothing but the pinned run dir was written: no node made a run dir of its own."""
    assert not (cwd / "outputs").exists() and not (cwd / "multirun").exists(), list(cwd.rglob("*"))[:20]
    assert run.is_dir()


def test_static_rendezvous_sigterm_on_one_node_and_resume_on_both(tmp_path: Path, cells) -> None:
    """Static rendezvous, DDP. A SIGTERM to node 1's launcher: every rank (both nodes) checkpoints the same
    step and exits 75, as on one node. ``resume=`` on both nodes continues in the one run dir and ends with
    the one-node run's weights, bit for bit; the run's files were written once, by node 0."""
    run = tmp_path / "shared" / "run"
    nodes = two_nodes(tmp_path, run, static_at(free_port()), *node_command(DDP, tmp_path))
    wait_for_step(run, 3, nodes, timeout=TIMEOUT)
    nodes[1].send_signal(signal.SIGTERM)
    errs = finish_all(nodes)
    for node, err in zip(nodes, errs, strict=True):
        assert node.returncode == EXIT_INTERRUPTED, err[-3000:]
        assert "Traceback" not in err, err[-3000:]
    stopped = [json.loads((run / f".rank{r}.stopped.json").read_text()) for r in (0, 1)]
    assert stopped[0] == stopped[1] and stopped[0]["signum"] == signal.SIGTERM
    (checkpoint,) = checkpoints_in(run)
    assert verify(checkpoint) is None and checkpoint.name == f"checkpoint-{stopped[0]['step']}"
    assert f"Resume with: hydratune resume={run} launcher.node_rank=<its rank> (on every node)" in errs[0]
    for saved in (run / ".hydra" / "config.yaml", run / "frozen_config.yaml"):  # written once, by node 0
        assert OmegaConf.load(saved).launcher.node_rank == 0

    # (the resumed nodes fork their workers: how they start is not what the resume shows)
    resumed = [
        start(tmp_path, f"resume={run}", FORK),
        start(tmp_path, f"resume={run}", FORK, "launcher.node_rank=1"),
    ]
    for node, err in zip(resumed, finish_all(resumed), strict=True):
        assert node.returncode == 0, err[-3000:]
        assert "continues in its own run dir on every node" in err
    one_run_dir(tmp_path, run)
    again = OmegaConf.load(run / ".hydra" / "config.yaml")  # node 0's again: node 1 never wrote its own
    assert again.launcher.node_rank == 0 and again.resume == str(run)
    assert_bit_identical(run, cells[DDP].run)


def test_c10d_rendezvous_zero2_matches_one_node(tmp_path: Path, cells) -> None:
    """c10d rendezvous (node ranks by arrival), DeepSpeed ZeRO-2: both nodes exit 0, one run dir, the
    one-node run's weights bit for bit. (Each node forks its worker: how a worker starts is not what this
    checks, and the static rendezvous test starts them the default way.)"""
    run = tmp_path / "shared" / "run"
    nodes = two_nodes(tmp_path, run, c10d_at(free_port()), *node_command(ZERO2, tmp_path), FORK)
    for node, err in zip(nodes, finish_all(nodes), strict=True):
        assert node.returncode == 0, err[-3000:]
    one_run_dir(tmp_path, run)
    live = json.loads((run / "result.json").read_text())["run"]["live strategy"]
    assert live == "DEEPSPEED, ZeRO stage 2, 2 process(es)"  # not a silent fallback to DDP
    assert_bit_identical(run, cells[ZERO2].run)


def test_a_node_that_never_comes_is_named_and_a_waiting_node_answers_sigterm(tmp_path: Path) -> None:
    """Node 1 never starts: node 0 gives up after ``launcher.rdzv_timeout`` with exit 2 and one paragraph
    naming the missing node and the endpoint, no traceback (c10d here; the static wording is checked in
    tests/unit/test_rendezvous.py). A node still waiting at a static rendezvous stops at once on SIGTERM, as
    before any training (exit 128 + 15), leaving no run dir."""
    ports = {"missing": free_port(), "waiting": free_port()}
    job = [*node_command(DDP, tmp_path), "launcher.nnodes=2"]
    missing = start(
        tmp_path,
        *job,
        "launcher.rdzv_timeout=3",
        *c10d_at(ports["missing"]),
        f"hydra.run.dir={tmp_path / 'c10d'}",
    )
    waiting = start(tmp_path, *job, *static_at(ports["waiting"]), f"hydra.run.dir={tmp_path / 'static'}")
    assert waiting.stderr is not None
    told = ""
    for line in waiting.stderr:  # the node says it is waiting, then is stopped
        told += line
        if "is at the rendezvous" in line:
            break
    assert "is at the rendezvous" in told, told + finish(waiting, timeout=60)
    waiting.send_signal(signal.SIGTERM)
    stopped_at = time.monotonic()
    err = told + finish(waiting, timeout=60)
    assert waiting.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert time.monotonic() - stopped_at < 30, "a waiting node must answer SIGTERM at once"
    assert "SIGTERM before training started" in err and not (tmp_path / "static").exists()

    err = finish(missing, timeout=120)
    assert missing.returncode == 2, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert f"only 1 of 2 nodes joined the c10d rendezvous at 127.0.0.1:{ports['missing']} within 3 s" in err
    assert not (tmp_path / "c10d").exists()  # nothing of value was written: no run dir left


def test_a_dead_node_stops_every_rank_and_is_named(tmp_path: Path) -> None:
    """SIGKILL to every process of node 1 mid-run: node 0's rank stops within seconds (no hang in a
    collective), node 0 exits 69 naming node 1 and its rank, no gloo traceback; the last whole checkpoint
    is kept and named with the command that resumes it. (The nodes fork their workers: node 1's whole
    process group dies either way.)"""
    run = tmp_path / "shared" / "run"
    overrides = [*node_command(DDP, tmp_path), "train.max_steps=100000", "train.save_every=2", FORK]
    nodes = two_nodes(tmp_path, run, static_at(free_port()), *overrides)
    deadline = time.monotonic() + TIMEOUT
    while not checkpoints_in(run) and time.monotonic() < deadline:
        assert all(n.poll() is None for n in nodes), finish_all(nodes, timeout=30)
        time.sleep(0.2)
    os.killpg(nodes[1].pid, signal.SIGKILL)
    killed_at = time.monotonic()
    err = finish_all(nodes[:1], timeout=120)[0]
    took = time.monotonic() - killed_at
    nodes[1].communicate()
    assert nodes[0].returncode == EXIT_NODE_LOST, err[-3000:]
    assert took < 60, f"node 0 took {took:.0f} s to stop"
    assert "Traceback" not in err and "gloo" not in err, err[-3000:]
    assert re.search(r"node 1 \([^)]*rank\(s\) 1\) stopped answering mid-run", err), err[-3000:]
    last = checkpoints_in(run)[-1]
    assert verify(last) is None
    assert f"The last whole checkpoint is {last}; resume with: hydratune resume={run}" in err


def sshd(root: Path) -> tuple[subprocess.Popen[bytes], Path, int]:
    """An sshd on a free port of 127.0.0.1 with a throwaway host key, this user's throwaway key authorized,
    and a ``bin/ssh`` that uses them (first on PATH: DeepSpeed's runner and pdsh call plain ``ssh``)."""
    port = free_port()
    for key in ("host_key", "id"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(root / key)], check=True)
    shutil.copy(root / "id.pub", root / "authorized_keys")
    (root / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {root / 'host_key'}\n"
        f"AuthorizedKeysFile {root / 'authorized_keys'}\nPidFile {root / 'sshd.pid'}\nStrictModes no\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n"
    )
    (root / "ssh_config").write_text(
        f"Host *\n  IdentityFile {root / 'id'}\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n"
        "  LogLevel ERROR\n"
    )
    bin_dir = root / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "ssh"
    shim.write_text(f'#!/bin/sh\nexec {shutil.which("ssh")} -F {root / "ssh_config"} "$@"\n')
    shim.chmod(0o755)
    Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # sshd's privilege separation dir
    server = subprocess.Popen(
        [shutil.which("sshd") or "/usr/sbin/sshd", "-D", "-f", str(root / "sshd_config")]
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        probe = subprocess.run(
            [str(shim), "-p", str(port), "-o", "BatchMode=yes", "127.0.0.1", "true"], check=False
        )
        if probe.returncode == 0:
            return server, bin_dir, port
        time.sleep(0.3)
    server.kill()
    pytest.fail("the test's sshd never accepted its key")


def ssh_transport_missing() -> str | None:
    """Why the hostfile test cannot run here (None: it can)."""
    if os.geteuid() != 0:
        return "an sshd that lets this user in with a throwaway key needs root"
    missing = [p for p in ("ssh", "ssh-keygen", "pdsh") if shutil.which(p) is None]
    if not (shutil.which("sshd") or Path("/usr/sbin/sshd").is_file()):
        missing.append("sshd")
    return f"not installed: {', '.join(missing)} (apt-get install openssh-server pdsh)" if missing else None


@pytest.mark.skipif(ssh_transport_missing() is not None, reason=str(ssh_transport_missing()))
def test_deepspeed_hostfile_over_ssh_matches_local_zero2(tmp_path: Path, cells) -> None:
    """DeepSpeed's launcher with a 2-host hostfile (two names of this machine), pdsh over a real sshd:
    ZeRO-2 ends bit-identical to the local 2-process run. The run's environment reached the hosts (a
    fresh ssh login has none of it) through a private .deepspeed_env; the token in it was never printed
    and nothing of it was left in the run dir or the working dir."""
    server, bin_dir, port = sshd(tmp_path)
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=1\n127.0.0.1 slots=1\n")
    run = tmp_path / "shared" / "run"
    secret = "hf_multinode_test_secret"
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "HF_TOKEN": secret, "HF_HUB_OFFLINE": "1"}
    try:
        proc = start(
            tmp_path,
            *node_command(ZERO2, tmp_path),
            "launcher=deepspeed",
            f"launcher.hostfile={hostfile}",
            f"launcher.ssh_port={port}",
            f"hydra.run.dir={run}",
            env=env,
        )
        out, err = proc.communicate(timeout=TIMEOUT)
    finally:  # the runner's group (pdsh, ssh) is killed after the test; what the sshd ran for it here
        server.terminate()
        server.wait(timeout=30)
        kill_mentioning(str(run))
    assert proc.returncode == 0, err[-3000:]
    assert "--launcher pdsh" in err and "every host gets" in err and "HF_TOKEN (secret)" in err
    assert secret not in out + err
    environment = json.loads((run / "versions.json").read_text())["environment"]
    assert environment["OMP_NUM_THREADS"] == "1" and environment["HF_HUB_OFFLINE"] == "1"
    assert environment["HF_TOKEN"] == "<set>"
    leftovers = [p for p in (*run.rglob("*"), *tmp_path.glob(".deepspeed_env")) if p.is_file()]
    assert not any(secret in p.read_text(errors="replace") for p in leftovers)
    assert not any(p.name == ".deepspeed_env" for p in leftovers)
    assert_bit_identical(run, cells[ZERO2].run)
