"""A multi-node Ray cluster on one machine: every node a Linux network namespace with its own address.

``Cluster(specs)`` builds, as root:
  - a bridge in the root namespace (no address of its own: nothing outside the cluster can reach it, and it can reach
    nothing), and per node a namespace ``alc<run>-node<K>`` whose ``eth0`` (a veth whose other end is on the bridge)
    holds ``10.238.0.<K+1>/24``, with ``lo`` up;
  - a Ray head in node 0 and Ray worker nodes in the nodes whose spec asks for one (``ray start`` run inside the
    namespace, each node declaring ``{"node<K>": 1}`` and its own CPUs; small object stores, no dashboard; Ray's
    token authentication with a token of this cluster's, which ``Node.run``/``Node.spawn`` give every process);
  - processes of the caller's (``Node.spawn``) in any node.
``<run>`` is the owning process's pid, so two runs never share a name and a leftover of a run whose process is dead
is recognised and removed at the next start (``remove_stale``).

Teardown kills every process inside each namespace (whatever started it: a Ray daemon, a worker, an engine server
that a Ray actor started), then deletes the namespaces, the veths and the bridge. It runs on ``stop()``, at exit and
on SIGTERM/SIGHUP; a SIGKILL leaves the next run's ``remove_stale`` to do it.

A partition is a node's bridge-side veth taken down (``partition``/``heal``): the node keeps its address and its
processes, and every packet to or from it is lost, as when a switch port or a NIC fails.

Imported by the tests in this folder and by benchmarks (``from tests.cluster.harness import Cluster``).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, Self

#: Every name this harness gives starts with it (namespaces, links, temp folders).
PREFIX = "alc"
#: The nodes' subnet: private, and unlikely to be a real network's (the bridge has no address anyway).
SUBNET = "10.238.0"
RAY_PORT = 6379
#: The smallest object store Ray accepts (75 MiB) plus a margin: the engines pass nothing through it.
OBJECT_STORE_BYTES = 80 * 1024 * 1024
_NETNS_DIR = Path("/run/netns")
_TEMP_ROOT = Path("/tmp")
_RAY_STARTUP_TIMEOUT = "The current node timed out during startup"
_NAME = re.compile(rf"^{PREFIX}(\d+)(?:-node\d+|-probe|br|n\d+|p\d+)?$")


class ClusterError(RuntimeError):
    """The cluster could not be built or a node did not come up (the node's log tail is in the message)."""


@functools.cache
def skip_reason() -> str | None:
    """Why this machine cannot run a cluster (None: it can)."""
    if sys.platform != "linux":
        return "network namespaces are Linux's"
    if os.geteuid() != 0:
        return "needs root (ip netns, veth, bridge)"
    if shutil.which("ip") is None:
        return "needs iproute2's ip"
    probe = f"{PREFIX}{os.getpid()}-probe"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and result.returncode != 0:
        raise ClusterError(f"ip {' '.join(args)}: {result.stderr.strip()}")
    return result


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def namespace_pids(name: str) -> list[int]:
    """Every process whose network namespace is ``name`` (what ``ip netns pids`` lists)."""
    try:
        target = os.stat(_NETNS_DIR / name)
    except FileNotFoundError:
        return []
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):  # gone meanwhile, or a zombie (no namespace left)
            found = os.stat(f"/proc/{entry.name}/ns/net")
            if (found.st_ino, found.st_dev) == (target.st_ino, target.st_dev):
                pids.append(int(entry.name))
    return pids


def kill_namespace(name: str, grace_s: float = 2.0) -> int:
    """SIGTERM every process in namespace ``name``, SIGKILL what is left after ``grace_s``; return how many were
    killed. Processes started later in the namespace (a daemon restarting a worker) are caught by the next round."""
    killed: set[int] = set()
    deadline = time.monotonic() + grace_s
    signum = signal.SIGTERM
    while pids := namespace_pids(name):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
        killed.update(pids)
        time.sleep(0.05)
        if time.monotonic() > deadline:
            signum = signal.SIGKILL
        if time.monotonic() > deadline + 10:
            raise ClusterError(f"processes {pids} in {name} survived SIGKILL")
    return len(killed)


def _owner(name: str) -> int | None:
    match = _NAME.match(name)
    return int(match.group(1)) if match else None


def remove_stale(include_own: bool = False) -> list[str]:
    """Remove what runs whose process is dead left: namespaces (and their processes), links, temp folders (and,
    with ``include_own``, what an earlier cluster of this process left). Runs of other live processes (another
    test session on the same machine) are left alone. Return the names removed."""

    def stale(name: str) -> bool:
        owner = _owner(name)
        return owner is not None and ((include_own and owner == os.getpid()) or not _alive(owner))

    removed = []
    for name in sorted(os.listdir(_NETNS_DIR)) if _NETNS_DIR.is_dir() else []:
        if stale(name):
            kill_namespace(name, grace_s=1.0)
            _ip("netns", "del", name, check=False)
            removed.append(name)
    links = _ip("-o", "link", "show").stdout
    for name in re.findall(rf"^\d+: ({PREFIX}\w+)[@:]", links, flags=re.MULTILINE):
        if stale(name):
            _ip("link", "del", name, check=False)  # a veth's peer goes with it
            removed.append(name)
    for folder in _TEMP_ROOT.glob(f"{PREFIX}[0-9]*"):
        if stale(folder.name):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(str(folder))
    return removed


@dataclass(frozen=True)
class NodeSpec:
    """One node of the cluster."""

    #: Join Ray (node 0 is the head; without Ray on node 0 the cluster has no Ray at all). A node without Ray is a
    #: plain host (e.g. a tool server's).
    ray: bool = True
    #: CPUs the node offers Ray (0: nothing is scheduled there, e.g. a head that only runs drivers).
    num_cpus: float = 1
    #: More Ray resources of the node, beside ``{"node<K>": 1}``.
    resources: Mapping[str, float] = field(default_factory=dict)


@dataclass
class Node:
    """A node: its namespace, address and the processes started in it."""

    index: int
    run_id: int
    spec: NodeSpec
    temp_dir: Path
    #: What every process started in the node gets in its environment (the cluster's Ray settings).
    env: Mapping[str, str] = field(default_factory=dict)
    processes: list[subprocess.Popen] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"node{self.index}"

    @property
    def namespace(self) -> str:
        return f"{PREFIX}{self.run_id}-node{self.index}"

    @property
    def address(self) -> str:
        return f"{SUBNET}.{self.index + 1}"

    @property
    def veth(self) -> str:
        """The bridge-side end of the node's link (what ``partition`` takes down)."""
        return f"{PREFIX}{self.run_id}n{self.index}"

    def command(self, args: Sequence[str]) -> list[str]:
        """``args`` run inside this node's namespace."""
        return ["ip", "netns", "exec", self.namespace, *args]

    def run(self, args: Sequence[str], timeout: float = 120, env: Mapping[str, str] | None = None,
            check: bool = False) -> subprocess.CompletedProcess[str]:
        """Run ``args`` in this node to completion (output captured)."""
        return subprocess.run(self.command(args), capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **self.env, **(env or {})}, check=check)

    def spawn(self, args: Sequence[str], log: Path | None = None, env: Mapping[str, str] | None = None,
              stdout: int | IO | None = None, stdin: int | IO | None = None) -> subprocess.Popen:
        """Start ``args`` in this node in its own session; its output goes to ``log`` (default: the node's temp
        folder) unless ``stdout`` is given (then text, as ``stdin``). Returns once the process is in the node's
        namespace (or has exited). Stopped with the node whatever happens."""
        log = log or self.temp_dir / f"spawn-{len(self.processes)}.log"
        with log.open("ab") as sink:
            process = subprocess.Popen(
                self.command(args), stdout=stdout if stdout is not None else sink, stderr=sink, stdin=stdin,
                env={**os.environ, **self.env, **(env or {})}, start_new_session=True,
                text=stdout is not None or stdin is not None,
            )
        self.processes.append(process)
        deadline = time.monotonic() + 5
        while process.poll() is None and process.pid not in namespace_pids(self.namespace):
            if time.monotonic() > deadline:
                raise ClusterError(f"{args[0]} did not enter {self.namespace} within 5 s")
            time.sleep(0.005)
        return process


_LIVE: set[Cluster] = set()
_LIVE_LOCK = threading.Lock()
_HANDLED = (signal.SIGTERM, signal.SIGHUP)
_previous_handlers: dict[int, object] = {}


def _stop_all() -> None:
    with _LIVE_LOCK:
        clusters = list(_LIVE)
    for cluster in clusters:
        cluster.stop()


def _on_signal(signum: int, frame: FrameType | None) -> None:
    _stop_all()
    previous = _previous_handlers.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)
    else:  # the default action (die of the signal), as if we had not been here
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def _install_handlers() -> None:
    if _previous_handlers or threading.current_thread() is not threading.main_thread():
        return
    atexit.register(_stop_all)
    for signum in _HANDLED:
        _previous_handlers[signum] = signal.getsignal(signum)
        signal.signal(signum, _on_signal)


class Cluster:
    """Namespaces, a bridge and Ray nodes; ``with Cluster(...) as cluster`` builds and tears them down."""

    def __init__(self, specs: Sequence[NodeSpec], ray_start_timeout_s: float = 120.0) -> None:
        if not specs:
            raise ValueError("a cluster has at least one node")
        if not specs[0].ray and any(spec.ray for spec in specs):
            raise ValueError("node 0 is the Ray head: a cluster with Ray workers needs ray=True on node 0")
        if len(specs) > 250:
            raise ValueError("at most 250 nodes (one /24)")
        self.run_id = os.getpid()
        self.root = _TEMP_ROOT / f"{PREFIX}{self.run_id}"
        #: Ray's settings for every process of the cluster: its own token (not ~/.ray's, which local Rays of the
        #: same user share), no usage reports.
        self.env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32),
                    "RAY_USAGE_STATS_ENABLED": "0"}
        self.nodes = [Node(k, self.run_id, spec, self.root / f"node{k}", self.env) for k, spec in enumerate(specs)]
        self.ray_start_timeout_s = ray_start_timeout_s
        self.bridge = f"{PREFIX}{self.run_id}br"
        #: Seconds each phase of ``start`` took: network, ray head, ray workers.
        self.timings: dict[str, float] = {}
        self._stopped = True

    @property
    def head(self) -> Node:
        return self.nodes[0]

    @property
    def ray_address(self) -> str:
        return f"{self.head.address}:{RAY_PORT}"

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- building -------------------------------------------------------------------------------------------------

    def start(self) -> None:
        with _LIVE_LOCK:
            if _LIVE:  # the names are the process's: a second cluster would take the first one's
                raise ClusterError("one cluster per process at a time: stop the other first")
            _LIVE.add(self)
        self._stopped = False
        try:
            _install_handlers()
            remove_stale(include_own=True)
            began = time.monotonic()
            self._build_network()
            self.timings["network"] = time.monotonic() - began
            if self.head.spec.ray:
                began = time.monotonic()
                self._ray_start([self.head], ["--head", "--port", str(RAY_PORT), "--include-dashboard=false"])
                self.timings["ray_head"] = time.monotonic() - began
                began = time.monotonic()
                self._ray_start([n for n in self.nodes[1:] if n.spec.ray], ["--address", self.ray_address])
                self.timings["ray_workers"] = time.monotonic() - began
        except BaseException:
            self.stop()
            raise

    def _build_network(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("link", "set", self.bridge, "up")
        for node in self.nodes:
            node.temp_dir.mkdir(parents=True, exist_ok=True)
            peer = f"{PREFIX}{self.run_id}p{node.index}"
            _ip("netns", "add", node.namespace)
            _ip("link", "add", node.veth, "type", "veth", "peer", "name", peer)
            _ip("link", "set", peer, "netns", node.namespace)
            _ip("-n", node.namespace, "link", "set", peer, "name", "eth0")
            _ip("-n", node.namespace, "addr", "add", f"{node.address}/24", "dev", "eth0")
            _ip("-n", node.namespace, "link", "set", "eth0", "up")
            _ip("-n", node.namespace, "link", "set", "lo", "up")
            _ip("link", "set", node.veth, "master", self.bridge)
            _ip("link", "set", node.veth, "up")

    def _ray_args(self, node: Node) -> list[str]:
        resources = {node.name: 1, **node.spec.resources}
        return [
            str(Path(sys.executable).parent / "ray"), "start", "--node-ip-address", node.address,
            "--num-cpus", f"{node.spec.num_cpus:g}", "--resources", json.dumps(resources),
            "--object-store-memory", str(OBJECT_STORE_BYTES), "--disable-usage-stats",
            "--temp-dir", str(node.temp_dir / "ray"),
        ]

    def _ray_start_async(self, node: Node, extra: list[str]) -> subprocess.Popen:
        log = node.temp_dir / "ray-start.log"
        with log.open("wb") as sink:
            process = subprocess.Popen(node.command([*self._ray_args(node), *extra]), stdout=sink,
                                       stderr=subprocess.STDOUT, env={**os.environ, **self.env},
                                       start_new_session=True)
        node.processes.append(process)
        return process

    def _ray_start(self, nodes: Sequence[Node], extra: list[str]) -> None:
        """``ray start`` in ``nodes`` at once; each returns once its raylet has registered with the head. Ray gives
        a raylet a hard-coded 30 s for that, which a loaded machine can miss (seen at a load average of 36 on two
        cores): such a node is cleared and started once more, alone."""
        failures = [(node, self._ray_failure(node, process))
                    for node, process in [(node, self._ray_start_async(node, extra)) for node in nodes]]
        for node, failure in failures:
            if failure is not None and _RAY_STARTUP_TIMEOUT in failure:
                kill_namespace(node.namespace)
                failure = self._ray_failure(node, self._ray_start_async(node, extra))
            if failure is not None:
                raise ClusterError(failure)

    def _ray_failure(self, node: Node, process: subprocess.Popen) -> str | None:
        """None once ``ray start`` succeeded; else what went wrong, with its log's tail."""
        try:
            code = process.wait(self.ray_start_timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            code = None
        if code == 0:
            return None
        tail = "\n  ".join((node.temp_dir / "ray-start.log").read_text(errors="replace").splitlines()[-15:])
        outcome = "timed out" if code is None else f"exited {code}"
        return f"ray start in {node.name} ({node.address}) {outcome}:\n  {tail}"

    # -- faults ---------------------------------------------------------------------------------------------------

    def partition(self, node: Node) -> None:
        """Cut ``node`` off the network (its link down); its processes keep running."""
        _ip("link", "set", node.veth, "down")

    def heal(self, node: Node) -> None:
        _ip("link", "set", node.veth, "up")

    # -- teardown -------------------------------------------------------------------------------------------------

    def stop(self) -> None:
        """Kill every process in every node (workers first, the head last), delete the namespaces, links and temp
        folders. Idempotent; never raises for what is already gone."""
        if self._stopped:
            return
        self._stopped = True
        try:
            for node in reversed(self.nodes):
                kill_namespace(node.namespace)
                for process in node.processes:  # ours are our children: reaped here
                    if process.poll() is None:  # started so recently that it had not entered the namespace yet
                        with contextlib.suppress(ProcessLookupError):
                            os.killpg(process.pid, signal.SIGKILL)
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        process.wait(5)
                _ip("netns", "del", node.namespace, check=False)
            for node in self.nodes:
                _ip("link", "del", node.veth, check=False)
            _ip("link", "del", self.bridge, check=False)
            shutil.rmtree(self.root, ignore_errors=True)
        finally:
            with _LIVE_LOCK:
                _LIVE.discard(self)

    def leftovers(self) -> list[str]:
        """What of this cluster still exists (empty after ``stop``): namespaces, links, processes."""
        left = [n.namespace for n in self.nodes if (_NETNS_DIR / n.namespace).exists()]
        links = _ip("-o", "link", "show").stdout
        left += re.findall(rf"^\d+: ({PREFIX}{self.run_id}\w+)[@:]", links, flags=re.MULTILINE)
        left += [f"pid {p.pid}" for n in self.nodes for p in n.processes if p.poll() is None]
        return left
