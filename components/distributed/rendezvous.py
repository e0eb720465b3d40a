"""Multi-node bring-up for the local launcher: a roll call before torch elastic starts anything, and a
watch over the other nodes while the workers run.

torch elastic's own rendezvous blocks inside C++ when a node is missing (no word; Ctrl-C and SIGTERM wait
with it) and then fails with a bare timeout. So first every node's launcher joins a roll call on the TCP
store of the rendezvous endpoint (the static master or the c10d endpoint; torch's store later shares that
server: ``multi_tenant``). It claims its node slot, publishes its config and a nonce that it also writes
into the run dir, and polls in short steps (a signal ends the wait at once) until every node is there or
``launcher.rdzv_timeout`` has passed. Then every node checks that all run one config and see each other's
files in the one run dir; when one does not, all fail together, naming it. While the workers run, each
launcher beats a counter in that store and at its end records how its workers ended, so the launcher of a
node whose ranks lost a peer names the node that went silent (:meth:`Roster.verdict`).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from hydratune.components.config.errors import ConfigError

POLL_S = 0.5  # between two looks at the store while waiting (a signal is handled within this)
CONNECT_S = 2.0  # one try to reach the endpoint's store
STORE_OP_S = 10.0  # a store operation that takes longer: its host is gone
BEAT_S = 1.0  # a launcher's heartbeat
SILENT_S = 4.0  # a node whose heartbeat stood still this long is lost
VERDICT_S = 10.0  # how long a launcher whose ranks failed waits to learn which node is to blame
SHARED_S = 10.0  # how long a node looks for the others' files in the run dir (NFS caches directory entries)
NODE_FILE = ".workers/node.{nonce}.json"  # in the run dir: this node's own (the shared-dir check)


class RendezvousError(ConfigError):
    """The nodes did not all come together, or do not agree: nothing was started (exit 2)."""


class Aborted(RendezvousError):
    """Another node left the roll call (and said why)."""


@dataclass(frozen=True)
class Node:
    """One node's launcher, as it announced itself at the roll call."""

    slot: int
    host: str
    pid: int
    nonce: str

    def __str__(self) -> str:
        return f"node {self.slot} ({self.host})"

    def to_json(self) -> str:
        return json.dumps({"slot": self.slot, "host": self.host, "pid": self.pid, "nonce": self.nonce})

    @classmethod
    def from_json(cls, text: bytes | str) -> Node:
        data = json.loads(text)
        return cls(int(data["slot"]), str(data["host"]), int(data["pid"]), str(data["nonce"]))


def ranges(numbers: list[int]) -> str:
    """``[0, 1, 2, 5]`` → ``0-2, 5``."""
    spans: list[list[int]] = []
    for n in sorted(numbers):
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def differences(mine: dict[str, Any], theirs: dict[str, Any], shown: int = 3) -> str:
    """The keys of two flat configs that differ, as ``key: theirs → mine`` (the first ``shown``)."""
    keys = [k for k in {**theirs, **mine} if mine.get(k, "<absent>") != theirs.get(k, "<absent>")]
    listed = "; ".join(
        f"{k}: {theirs.get(k, '<absent>')!r} → {mine.get(k, '<absent>')!r}" for k in keys[:shown]
    )
    return listed + (f" (+{len(keys) - shown} more)" if len(keys) > shown else "")


def reachable(host: str, port: int, timeout: float = CONNECT_S) -> bool:
    """Whether something accepts a TCP connection at ``host:port`` (probed from Python: torch's client
    would log every failed try)."""
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError:
        return False
    return True


@dataclass
class RollCall:
    """What this node brings to the roll call. ``node_rank`` None: c10d (slots in order of arrival)."""

    host: str
    port: int
    nnodes: int
    node_rank: int | None
    run_id: str
    timeout: float
    run_dir: Path
    config: dict[str, Any]  # this node's config, flat, without the keys that may differ per node
    key: str = "launcher.rdzv_endpoint"  # the setting that names the endpoint, for the errors
    shared_wait: float = SHARED_S  # how long to look for the other nodes' files in the run dir
    say: Callable[[str], None] = field(
        default=lambda text: print(f"hydratune: {text}", file=sys.stderr, flush=True)
    )

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    def gather(self) -> Roster:
        """Wait until every node has joined and agrees; the roster keeps the store (and its server) open."""
        deadline = time.monotonic() + self.timeout
        store, hosting = self._connect(deadline)
        roster = Roster(store, self.run_id, self.nnodes, self.endpoint, self.say)
        try:
            roster.me = self._join(roster, hosting)
            self._wait_for_everyone(roster, deadline)
            self._agree(roster)
        except BaseException as err:  # a refusal, a timeout, Ctrl-C / SIGTERM: the others stop waiting too
            roster.abort(err)
            roster.leave(self.run_dir)
            raise
        return roster

    def _connect(self, deadline: float) -> tuple[Any, bool]:
        """The endpoint's store: hosted here (static: node 0; c10d: the node the endpoint names, the first
        process there to bind it), else reached as a client, retried until ``deadline``."""
        from torch.distributed import TCPStore

        hosting = self.node_rank == 0 if self.node_rank is not None else self._names_this_machine()
        if hosting:
            try:
                store = TCPStore(
                    self.host,
                    self.port,
                    is_master=True,
                    wait_for_workers=False,
                    multi_tenant=True,  # torch's rendezvous store in this process shares the server
                    timeout=timedelta(seconds=STORE_OP_S),
                )
                return store, True
            except (RuntimeError, ValueError) as err:
                if self.node_rank is not None:
                    raise RendezvousError(
                        f"node 0 cannot listen on port {self.port} for the rendezvous: {first_line(err)}",
                        key="launcher.master_port",
                        hint="choose a free launcher.master_port (the same on every node)",
                    ) from None
                # c10d: another process on this machine hosts it (two nodes on one host): join it
        told = False
        while True:
            if reachable(self.host, self.port):
                with contextlib.suppress(RuntimeError, ValueError):
                    return TCPStore(
                        self.host, self.port, is_master=False, timeout=timedelta(seconds=STORE_OP_S)
                    ), False
            if time.monotonic() > deadline:
                who = "node 0 (which hosts it)" if self.node_rank is not None else "the node it names"
                raise RendezvousError(
                    f"could not reach the rendezvous at {self.endpoint} within {self.timeout:g} s "
                    f"(launcher.rdzv_timeout): {who} has not started, or the address is not reachable from "
                    f"{socket.gethostname()}",
                    key=self.key,
                    hint=f"start node 0 too, check that {self.endpoint} is reachable from every node "
                    "(firewall, address), or raise launcher.rdzv_timeout",
                )
            if not told:
                self.say(f"waiting for the rendezvous at {self.endpoint} (up to {self.timeout:g} s)")
                told = True
            time.sleep(POLL_S)

    def _names_this_machine(self) -> bool:
        from torch.distributed.elastic.rendezvous.utils import _matches_machine_hostname

        return bool(_matches_machine_hostname(self.host))

    def _join(self, roster: Roster, hosting: bool) -> Node:
        """Claim this node's slot (static: its node_rank, once; c10d: the next free one) and publish its
        config; write its nonce into the run dir (read back by the others: one shared run dir)."""
        nonce = uuid.uuid4().hex
        if self.node_rank is not None:
            slot = self.node_rank
        else:
            slot = roster.store.add("arrivals", 1) - 1
            if slot >= self.nnodes:
                raise RendezvousError(
                    f"more nodes joined the rendezvous at {self.endpoint} than launcher.nnodes={self.nnodes}",
                    key="launcher.nnodes",
                    hint=f"start launcher.nnodes={self.nnodes} nodes, or set launcher.nnodes to their number",
                )
        me = Node(slot, socket.gethostname(), os.getpid(), nonce)
        claimed = roster.store.compare_set(f"node/{slot}", "", me.to_json())
        if claimed.decode() != me.to_json():
            other = Node.from_json(claimed)
            raise RendezvousError(
                f"launcher.node_rank={slot} is taken: {other} (pid {other.pid}) joined as node {slot}",
                key="launcher.node_rank",
                hint=f"give every node its own launcher.node_rank in 0..{self.nnodes - 1}",
            )
        roster.store.set(f"config/{slot}", json.dumps(self.config, sort_keys=True, default=str))
        if hosting:
            roster.store.set("host_slot", str(slot))
        path = self.run_dir / NODE_FILE.format(nonce=nonce)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(me.to_json())
        return me

    def _wait_for_everyone(self, roster: Roster, deadline: float) -> None:
        told = False
        keys = [f"node/{i}" for i in range(self.nnodes)]
        while not roster.checked(keys):
            missing = [i for i in range(self.nnodes) if not roster.checked([f"node/{i}"])]
            if time.monotonic() > deadline:
                raise self._missing(roster, missing)
            if not told:
                which = self._which(missing)
                self.say(
                    f"{roster.me} is at the rendezvous {self.endpoint}; waiting up to {self.timeout:g} s "
                    f"(launcher.rdzv_timeout) for {which}"
                )
                told = True
            time.sleep(POLL_S)
        roster.nodes = [Node.from_json(v) for v in roster.store.multi_get(keys)]

    def _which(self, missing: list[int]) -> str:
        if self.node_rank is None:
            return f"{len(missing)} more node(s) of {self.nnodes} (c10d: node ranks go by arrival)"
        return f"node(s) {ranges(missing)} of {self.nnodes}"

    def _missing(self, roster: Roster, missing: list[int]) -> RendezvousError:
        here = [Node.from_json(roster.store.get(f"node/{i}")) for i in range(self.nnodes) if i not in missing]
        joined = ", ".join(map(str, here))
        if self.node_rank is None:
            what = f"only {len(here)} of {self.nnodes} nodes joined the c10d rendezvous at {self.endpoint}"
            start = "start the same command on the missing node(s)"
        else:
            what = (
                f"node(s) {ranges(missing)} of {self.nnodes} never joined the rendezvous at {self.endpoint}"
            )
            start = (
                "start the same command on node(s) " + ranges(missing) + " (each with its launcher.node_rank)"
            )
        return RendezvousError(
            f"{what} within {self.timeout:g} s (launcher.rdzv_timeout); joined: {joined}",
            key="launcher.nnodes",
            hint=f"{start}, check that they reach {self.endpoint} (firewall, launcher.master_addr / "
            "launcher.rdzv_endpoint), or raise launcher.rdzv_timeout",
        )

    def _agree(self, roster: Roster) -> None:
        """Every node runs node 0's config and sees every other node's file in the run dir; each publishes
        what it found, and all raise when any found a problem."""
        problems = self._config_problems(roster) or self._run_dir_problems(roster)
        roster.store.set(f"ready/{roster.me.slot}", problems)
        keys = [f"ready/{i}" for i in range(self.nnodes)]
        deadline = time.monotonic() + self.shared_wait + STORE_OP_S
        while not roster.checked(keys):
            if time.monotonic() > deadline:
                raise RendezvousError(
                    f"the nodes did not all confirm the rendezvous at {self.endpoint} within "
                    f"{self.shared_wait + STORE_OP_S:g} s",
                    key=self.key,
                )
            time.sleep(POLL_S)
        found = [
            (node, text.decode())
            for node, text in zip(roster.nodes, roster.store.multi_get(keys), strict=True)
        ]
        found = [(node, text) for node, text in found if text]
        if found:
            node, text = found[0]
            message, _, hint = text.partition("\n  fix: ")
            raise RendezvousError(f"{node}: {message}", key=None, hint=hint or None)

    def _config_problems(self, roster: Roster) -> str:
        first = roster.nodes[0]
        if roster.me.slot == first.slot:
            return ""
        theirs = json.loads(roster.store.get(f"config/{first.slot}"))
        if theirs == json.loads(json.dumps(self.config, sort_keys=True, default=str)):
            return ""
        return (
            f"runs another config than {first}: {differences(self.config, theirs)}\n  fix: start every node "
            "with the same command (only launcher.node_rank and launcher.rdzv_timeout may differ)"
        )

    def _run_dir_problems(self, roster: Roster) -> str:
        deadline = time.monotonic() + self.shared_wait
        while True:
            unseen = [n for n in roster.nodes if not seen_in(self.run_dir, n)]
            if not unseen or time.monotonic() > deadline:
                break
            time.sleep(POLL_S)
        if not unseen:
            return ""
        return (
            f"does not see the file {', '.join(map(str, unseen))} wrote into the run dir {self.run_dir}: the "
            "nodes do not share it\n  fix: pin hydra.run.dir to one directory on a filesystem every node "
            "mounts (NFS, Lustre, ...), the same path on every node"
        )


def seen_in(run_dir: Path, node: Node) -> bool:
    path = run_dir / NODE_FILE.format(nonce=node.nonce)
    try:
        return Node.from_json(path.read_text()).nonce == node.nonce
    except (OSError, ValueError, KeyError):
        return False


def first_line(err: BaseException) -> str:
    lines = [line for line in str(err).splitlines() if line.strip()]
    return lines[0] if lines else type(err).__name__


@dataclass
class Ending:
    """How a node's workers ended, as its launcher recorded it in the store."""

    how: str  # done | stopped | failed | lost (its ranks lost a peer)
    detail: str = ""

    def to_json(self) -> str:
        return json.dumps({"how": self.how, "detail": self.detail})


@dataclass
class NodeVerdict:
    """After this node's ranks failed: which other nodes went silent, which failed themselves."""

    silent: list[Node]
    failed: list[tuple[Node, Ending]]

    def blame(self) -> str:
        """One sentence naming the node(s) to blame ('' when none could be named)."""
        if self.silent:
            nodes = ", ".join(map(str, self.silent))
            return f"{nodes} stopped answering mid-run (its processes were killed, crashed, or went offline)"
        if self.failed:
            return "; ".join(f"{node} failed: {ending.detail}" for node, ending in self.failed)
        return ""


class Roster:
    """The nodes that met at the roll call, and the store they met in (kept open for the watch)."""

    def __init__(
        self, store: Any, run_id: str, nnodes: int, endpoint: str, say: Callable[[str], None]
    ) -> None:
        from torch.distributed import PrefixStore

        self.server = store  # keeps the server alive in the hosting process
        self.store = PrefixStore(f"hydratune/{run_id}", store)
        self.nnodes = nnodes
        self.endpoint = endpoint
        self.say = say
        self.me = Node(-1, socket.gethostname(), os.getpid(), "")
        self.nodes: list[Node] = []
        self.ranks: dict[int, str] = {}  # slot → its ranks, as each launcher published them
        self._beats: dict[int, tuple[int, float]] = {}  # slot → (last counter seen, when it moved)
        self._lost_store_at: float | None = None
        self._silent: set[int] = set()  # slots the verdict found silent
        self._settled: set[int] = set()  # slots that ended without a verdict of their own (done, stopped)
        self._watch: threading.Thread | None = None
        self._stop = threading.Event()

    def checked(self, keys: list[str]) -> bool:
        """``store.check`` that also ends the wait when another node aborted."""
        if self.store.check(["abort"]):
            raise Aborted(f"{self.store.get('abort').decode()}: the rendezvous at {self.endpoint} ended")
        return bool(self.store.check(keys))

    def abort(self, err: BaseException) -> None:
        """Tell the other nodes why this one leaves the roll call (best effort)."""
        if isinstance(err, Aborted):
            return
        who = str(self.me) if self.me.slot >= 0 else f"a node on {self.me.host}"
        why = "was stopped" if isinstance(err, KeyboardInterrupt) else f"failed: {first_line(err)}"
        with contextlib.suppress(Exception):
            self.store.compare_set("abort", "", f"{who} {why}")

    def others(self) -> list[Node]:
        return [n for n in self.nodes if n.slot != self.me.slot]

    def host_slot(self) -> int | None:
        with contextlib.suppress(Exception):
            return int(self.store.get("host_slot")) if self.store.check(["host_slot"]) else None
        return None

    # the watch while the workers run -------------------------------------------------------------

    def watch(self, local_ranks: Callable[[], list[int]]) -> None:
        """Beat this node's counter every ``BEAT_S`` and note when each other node's last moved; publish
        this node's ranks once its workers registered."""
        self._host_slot = self.host_slot()
        self._watch = threading.Thread(target=self._beat_until_stopped, args=(local_ranks,), daemon=True)
        self._watch.start()

    def _beat_until_stopped(self, local_ranks: Callable[[], list[int]]) -> None:
        published = False
        while not self._stop.wait(BEAT_S):
            self.beat()
            if not published and (ranks := local_ranks()):
                with contextlib.suppress(Exception):
                    self.store.set(f"ranks/{self.me.slot}", ranges(ranks))
                    published = True

    def beat(self) -> None:
        """One heartbeat, and a look at the others' (a store that no longer answers: its host is gone)."""
        now = time.monotonic()
        try:
            self.store.add(f"beat/{self.me.slot}", 1)
            for node in self.others():
                key = f"beat/{node.slot}"
                count = int(self.store.get(key)) if self.store.check([key]) else 0
                if node.slot not in self._beats or self._beats[node.slot][0] != count:
                    self._beats[node.slot] = (count, now)
        except Exception:
            self._lost_store_at = self._lost_store_at or now

    def stop_watch(self) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.join()
            self._watch = None

    def publish(self, ending: Ending) -> None:
        with contextlib.suppress(Exception):
            self.store.set(f"end/{self.me.slot}", ending.to_json())

    def verdict(self, ending: Ending) -> NodeVerdict:
        """Publish how this node's workers ended, then learn (within ``VERDICT_S``) how every other node's
        did: a recorded ending, or silence (its heartbeat stood still, or the store's host is gone)."""
        self.stop_watch()
        self.publish(ending)
        deadline = time.monotonic() + VERDICT_S
        endings: dict[int, Ending] = {}
        silent: list[Node] = []
        while True:
            self.beat()
            now = time.monotonic()
            for node in self.others():
                if node.slot not in endings:
                    with contextlib.suppress(Exception):
                        if self.store.check([f"end/{node.slot}"]):
                            endings[node.slot] = Ending(**json.loads(self.store.get(f"end/{node.slot}")))
            if self._lost_store_at is not None:
                silent = [n for n in self.others() if n.slot == self._host_slot and n.slot not in endings]
                break
            silent = [
                n
                for n in self.others()
                if n.slot not in endings and now - self._beats.get(n.slot, (0, now))[1] > SILENT_S
            ]
            if len(endings) + len(silent) == len(self.others()) or now > deadline:
                break
            time.sleep(POLL_S)
        with contextlib.suppress(Exception):
            self.store.set(f"seen/{self.me.slot}", "1")
        self._silent = {n.slot for n in silent}
        self._settled = {slot for slot, ending in endings.items() if ending.how in ("done", "stopped")}
        failed = [
            (n, endings[n.slot])
            for n in self.others()
            if n.slot in endings and endings[n.slot].how == "failed"
        ]
        return NodeVerdict(silent=[self._with_ranks(n) for n in silent], failed=failed)

    def _with_ranks(self, node: Node) -> Node:
        with contextlib.suppress(Exception):
            if self.store.check([f"ranks/{node.slot}"]):
                ranks = self.store.get(f"ranks/{node.slot}").decode()
                return Node(node.slot, f"{node.host}, rank(s) {ranks}", node.pid, node.nonce)
        return node

    def leave(self, run_dir: Path, linger: bool = False) -> None:
        """Stop the watch and remove this node's file from the run dir. A hosting node whose run failed
        first waits (briefly) until every node that is still there has read the endings (its verdict): the
        store goes when this process exits."""
        self.stop_watch()
        waiting = [n for n in self.others() if n.slot not in self._silent and n.slot not in self._settled]
        if linger and waiting and self.host_slot() == self.me.slot:
            keys = [f"seen/{n.slot}" for n in waiting]
            deadline = time.monotonic() + VERDICT_S
            with contextlib.suppress(Exception):
                while not self.store.check(keys) and time.monotonic() < deadline:
                    time.sleep(POLL_S)
        if self.me.nonce:
            (run_dir / NODE_FILE.format(nonce=self.me.nonce)).unlink(missing_ok=True)


#: what a failed collective says when another rank went away (gloo / NCCL / the TCP store)
LOST_PEER = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "Connection refused",
    "No route to host",
    "Timed out waiting",
    "timed out",
    "Socket Timeout",
    "communicator was aborted",
)


def lost_peer(err: BaseException | None) -> str | None:
    """The line that says so when ``err`` (or what caused it) is a collective that failed because another
    rank went away (its connection closed, or no answer within the process group's timeout); None for any
    other error."""
    import torch.distributed as dist

    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        text = str(err)
        distributed = isinstance(err, dist.DistError) or any(b in text for b in ("gloo", "NCCL", "c10d"))
        for line in text.splitlines() if distributed else ():
            if any(marker in line for marker in LOST_PEER):
                return tidy(line)
        err = err.__cause__ or err.__context__
    return None


def tidy(line: str) -> str:
    """A gloo / NCCL error line without its source location and advice: ``[.../pair.cc:553] Connection
    closed by peer [10.0.0.2]:4567. This is typically ...`` → ``Connection closed by peer [...]:4567``."""
    import re

    line = re.sub(r"^\[[^\]]*\.(?:cc|cpp|h|hpp):\d+\]\s*", "", line.strip())
    marker = next((m for m in LOST_PEER if m in line), "")
    end = line.find(". ", line.find(marker) + len(marker))
    return line[:end] if end > 0 else line.rstrip(".")
