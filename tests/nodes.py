"""Real "nodes" on one machine: two Linux network namespaces joined by a bridge (root only).

Layout of one bed; its id ``<pid>s<n>`` is the creating process's pid and its count of beds
(a process may hold several), and every name carries it (interface names stay within 15)::

    root namespace: bridge ackb<id>  10.X.Y.(8k+1)/29   <- the object store binds here
        ├── veth ackv<id>a ─── eth0 in netns asyncckpt-<id>-a  .2  hostname node-a
        └── veth ackv<id>b ─── eth0 in netns asyncckpt-<id>-b  .3  hostname node-b

A bridge in the root namespace (not a bare veth pair between the nodes) because the object
store lives there: the test process starts and inspects it as usual, both nodes reach it, and
nothing is routed (no ip_forward, no firewall rule). The /29 comes from the pid, passed over
while it overlaps a route already on the machine.

Node-local disk: every node sees its own directory at the same path, :attr:`Bed.local`
(think ``/nvme``). :meth:`Node.command` wraps a command as ``ip netns exec NS unshare --uts sh
-c 'hostname node-x; mount --bind <node's dir> <Bed.local>; exec CMD'``: ``ip netns exec``
already gives each command a mount namespace of its own, a *slave* of the root one, so the
bind mount is seen by that command and everything it starts (torchrun's workers, orted's
ranks) and by nothing else, and it disappears with them: no mount outlives its processes,
and there is no persistent mount namespace to leak. ``/etc/netns/NS/hosts`` (which
``ip netns exec`` binds over ``/etc/hosts``) makes node-a and node-b resolvable, as on a
cluster: gloo, torchrun's rendezvous and Open MPI use those names. The mount point and the
nodes' directories are under the bed's own directory, so no global path is touched.

``Bed.rsh`` is a remote shell for Open MPI (``--mca plm_rsh_agent``): ``mpirun --host
node-a:2,node-b:2`` started on node a runs its ranks there itself and starts node b's orted
through it, as ssh would on a cluster.

Teardown (:func:`destroy`) kills every process in each namespace (``ip netns pids``), deletes
the veths, namespaces, bridge, ``/etc/netns`` entries and the directory; it runs from a
fixture finalizer. Node commands get SIGKILL when their starter dies (``setpriv
--pdeathsig``). A bed whose creator was SIGKILLed is found by :func:`sweep_stale`: each bed
holds an ``flock`` on its directory's ``lock`` file for its life, and the kernel drops it when
the process dies, whatever killed it (so a reused pid is no problem).
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import itertools
import os
import re
import select
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

#: every bed's directory lives here: <STATE>/<id>/{lock,local,a,b}
STATE = Path(tempfile.gettempdir()) / "asyncckpt-nodes"
NETNS_PREFIX = "asyncckpt-"
ETC_NETNS = Path("/etc/netns")
NODE_NAMES = ("a", "b")
CAPS = ((12, "CAP_NET_ADMIN"), (21, "CAP_SYS_ADMIN"))  # (bit in CapEff, name)
#: runs inside the node's namespaces: hostname, node-local bind mount, then the command
NODE_SH = 'hostname "$1" && mount --bind "$2" "$3" && shift 3 && exec "$@"'
KILL_WAIT_S = 10.0
MAX_BEDS = 100  # per process: keeps interface names within IFNAMSIZ
_made = itertools.count()


class BedError(RuntimeError):
    """Creating or tearing down a bed failed on a machine that should support it."""


@dataclass(frozen=True)
class Node:
    """One "node": a network namespace with its address, host name and own local directory."""

    name: str  # "a" / "b"
    netns: str
    hostname: str
    address: str
    disk: Path  # what this node sees at Bed.local (read it from the test process here)
    local: Path  # the node-local path, the same on every node

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` to run on this node: its network, host name and local directory. It gets
        SIGKILL when the thread that started it dies (``setpriv --pdeathsig``), so a killed
        test run does not leave a job running until the next sweep."""
        sh = ["sh", "-c", NODE_SH, "node", self.hostname, str(self.disk), str(self.local)]
        netns = ["ip", "netns", "exec", self.netns, "unshare", "--uts", "--"]
        return ["setpriv", "--pdeathsig", "KILL", "--", *netns, *sh, *argv]

    def pids(self) -> list[int]:
        return netns_pids(self.netns)


@dataclass(frozen=True)
class Bed:
    id: str
    directory: Path
    bridge: str
    gateway: str  # the bridge's address in the root namespace: the object store binds here
    nodes: tuple[Node, ...]
    rsh: Path  # Open MPI's remote shell here: ``rsh HOST CMD...`` runs CMD on node HOST

    @property
    def local(self) -> Path:
        return self.nodes[0].local


#: torchrun's c10d rendezvous port, on node a's own address (nothing else listens there)
RDZV_PORT = 29400
#: what Open MPI needs to run as root (the bed is root-only)
MPI_ROOT_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def torchrun_commands(bed: Bed, python_args: Sequence[str], nproc: int = 2) -> list[tuple[Node, list[str]]]:
    """One torchrun per node (start them all), ``nproc`` ranks each, c10d rendezvous on node a.

    With c10d, torchrun gives node ranks in the order the agents join (``--node-rank`` is
    ignored), so a test tells nodes apart by host name, not by start order.
    """
    torchrun = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", str(len(bed.nodes)),
        "--nproc-per-node", str(nproc), "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"{bed.nodes[0].hostname}:{RDZV_PORT}", "--max-restarts", "0",
        "--monitor-interval", "0.1",
    ]  # fmt: skip
    return [(node, [*torchrun, *python_args]) for node in bed.nodes]


def mpirun_command(bed: Bed, argv: Sequence[str], nproc: int = 2) -> tuple[Node, list[str]]:
    """One mpirun, on node a as on a cluster's first node, ``nproc`` ranks per node; the other
    nodes' orted start through :attr:`Bed.rsh`. ``--bind-to none``: more ranks than cores.
    Give it :data:`MPI_ROOT_ENV` in its environment."""
    hosts = ",".join(f"{n.hostname}:{nproc}" for n in bed.nodes)
    mpirun = [
        "mpirun", "-np", str(nproc * len(bed.nodes)), "--host", hosts,
        "--mca", "plm_rsh_agent", str(bed.rsh), "--mca", "plm_rsh_no_tree_spawn", "1",
        "--bind-to", "none",
    ]  # fmt: skip
    return bed.nodes[0], [*mpirun, *argv]


def capability(bit: int) -> bool:
    """Whether this process holds capability ``bit`` (effective set, /proc/self/status)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> bit & 1)
    return False


def unavailable() -> str | None:
    """Why this machine cannot build a bed (then its tests skip with that), or ``None``."""
    if not Path("/proc/self/ns/net").exists():
        return "no Linux network namespaces (/proc/self/ns/net)"
    if os.geteuid() != 0:
        return "not root: network namespaces and bind mounts need root (CAP_NET_ADMIN, CAP_SYS_ADMIN)"
    lacking = [name for bit, name in CAPS if not capability(bit)]
    if lacking:
        return f"root without {' and '.join(lacking)}: no network namespaces or bind mounts here"
    missing = [
        tool for tool in ("ip", "unshare", "setpriv", "mount", "hostname") if shutil.which(tool) is None
    ]
    if missing:
        return f"missing {', '.join(missing)} (apt-get install iproute2 util-linux mount hostname)"
    probe = run("unshare", "--net", "--mount", "--uts", "true", check=False)  # e.g. a seccomp filter
    if probe.returncode != 0:
        return f"cannot create namespaces here: unshare: {probe.stderr.strip()}"
    return None


def run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise BedError(f"{' '.join(argv)}: rc {proc.returncode}: {proc.stderr.strip()}")
    return proc


def netns_pids(netns: str) -> list[int]:
    proc = run("ip", "netns", "pids", netns, check=False)
    return [int(p) for p in proc.stdout.split()] if proc.returncode == 0 else []


def kill_all(pids: Sequence[int], timeout: float = KILL_WAIT_S) -> None:
    """SIGKILL ``pids`` and wait (pidfd, no polling) until each is gone."""
    fds = []
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            fds.append(os.pidfd_open(pid))
            os.kill(pid, signal.SIGKILL)
    try:
        for fd in fds:
            if not select.select([fd], [], [], timeout)[0]:
                raise BedError(f"a process of the bed did not die within {timeout} s of SIGKILL")
    finally:
        for fd in fds:
            os.close(fd)


def routes() -> list[ipaddress.IPv4Network]:
    out = run("ip", "-4", "route", "show").stdout
    nets = []
    for line in out.splitlines():
        first = line.split()[0] if line.split() else ""
        if first != "default":
            with contextlib.suppress(ValueError):
                nets.append(ipaddress.IPv4Network(first, strict=False))
    return nets


def subnet_for(pid: int, seq: int) -> ipaddress.IPv4Network:
    """A /29 of 10.0.0.0/8 picked by ``pid`` and ``seq``, passing over any that overlaps a route here."""
    taken = routes()
    for attempt in range(64):
        index = (pid * MAX_BEDS + seq + attempt * 7919) % (1 << 21)
        net = ipaddress.IPv4Network((int(ipaddress.IPv4Address("10.0.0.0")) + index * 8, 29))
        if not any(net.overlaps(other) for other in taken):
            return net
    raise BedError("no free /29 in 10.0.0.0/8 (every candidate overlaps a route)")


def names(bed_id: str) -> tuple[str, dict[str, str], dict[str, str]]:
    """(bridge, netns by node, root-side veth by node) of the bed ``bed_id``."""
    return (
        f"ackb{bed_id}",
        {n: f"{NETNS_PREFIX}{bed_id}-{n}" for n in NODE_NAMES},
        {n: f"ackv{bed_id}{n}" for n in NODE_NAMES},
    )


def hold_lock(directory: Path) -> int:
    """Create ``directory`` and hold an exclusive flock on its ``lock`` for this process's life."""
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def create() -> tuple[Bed, int]:
    """Build a bed; returns it and the lock's descriptor (give both to :func:`destroy`)."""
    pid, seq = os.getpid(), next(_made)
    if seq >= MAX_BEDS:
        raise BedError(f"more than {MAX_BEDS} beds made by one process")
    bed_id = f"{pid}s{seq}"
    directory = STATE / bed_id
    lock = hold_lock(directory)
    try:
        return build(bed_id, subnet_for(pid, seq), directory), lock
    except BaseException:
        destroy_names(bed_id)
        os.close(lock)
        raise


def build(bed_id: str, net: ipaddress.IPv4Network, directory: Path) -> Bed:
    bridge, netns, veth = names(bed_id)
    hosts = list(net.hosts())  # .1 bridge, .2 node a, .3 node b
    run("ip", "link", "add", bridge, "type", "bridge")
    run("ip", "addr", "add", f"{hosts[0]}/{net.prefixlen}", "dev", bridge)
    run("ip", "link", "set", bridge, "up")
    local = directory / "local"
    local.mkdir()
    nodes = []
    etc_hosts = "127.0.0.1 localhost\n" + "".join(
        f"{hosts[i + 1]} node-{n}\n" for i, n in enumerate(NODE_NAMES)
    )
    for i, n in enumerate(NODE_NAMES):
        ns, address = netns[n], str(hosts[i + 1])
        run("ip", "netns", "add", ns)
        run("ip", "link", "add", veth[n], "type", "veth", "peer", "name", "eth0", "netns", ns)
        run("ip", "link", "set", veth[n], "master", bridge, "up")
        run("ip", "-n", ns, "addr", "add", f"{address}/{net.prefixlen}", "dev", "eth0")
        run("ip", "-n", ns, "link", "set", "eth0", "up")
        run("ip", "-n", ns, "link", "set", "lo", "up")
        (ETC_NETNS / ns).mkdir(parents=True, exist_ok=True)
        (ETC_NETNS / ns / "hosts").write_text(etc_hosts)
        disk = directory / n
        disk.mkdir()
        nodes.append(Node(n, ns, f"node-{n}", address, disk, local))
    return Bed(bed_id, directory, bridge, str(hosts[0]), tuple(nodes), write_rsh(directory, nodes))


def write_rsh(directory: Path, nodes: Sequence[Node]) -> Path:
    """An ``rsh``/``ssh`` stand-in for ``mpirun --mca plm_rsh_agent``: ``rsh node-b CMD...``
    runs the shell command CMD (joined as ssh joins it) on node-b, with that node's network,
    host name and local directory. A local exec, so the command inherits mpirun's environment
    as ``mpirun -x`` would have passed it."""
    cases = "".join(f'  {n.hostname}) exec {shlex.join(n.command(["sh", "-c"]))} "$cmd" ;;\n' for n in nodes)
    script = (
        '#!/bin/sh\nhost="$1"; shift\ncmd="$*"\ncase "$host" in\n'
        f'{cases}  *) echo "rsh: no node named $host" >&2; exit 255 ;;\nesac\n'
    )
    path = directory / "rsh"
    path.write_text(script)
    path.chmod(0o755)
    return path


def destroy_names(bed_id: str) -> None:
    """Remove everything of bed ``bed_id`` that exists (its processes first).

    A step that fails does not stop the others; then the bed's directory stays, so the next
    :func:`sweep_stale` tries again, and :class:`BedError` says what failed.
    """
    bridge, netns, veth = names(bed_id)
    existing = set(run("ip", "netns", "list", check=False).stdout.split())
    errors: list[str] = []
    for n in NODE_NAMES:
        if netns[n] in existing:
            try:
                kill_all(netns_pids(netns[n]))
            except BedError as exc:
                errors.append(f"{netns[n]}: {exc}")
        run("ip", "link", "del", veth[n], check=False)  # both ends, now (a netns delete defers it)
        if netns[n] in existing and not errors:  # (kept while a process may live on in it)
            deleted = run("ip", "netns", "del", netns[n], check=False)
            if deleted.returncode:
                errors.append(deleted.stderr.strip())
        shutil.rmtree(ETC_NETNS / netns[n], ignore_errors=True)
    run("ip", "link", "del", bridge, check=False)
    if errors:
        raise BedError(f"bed {bed_id} not fully removed: {'; '.join(errors)}")
    shutil.rmtree(STATE / bed_id, ignore_errors=True)
    with contextlib.suppress(OSError):  # /etc/netns itself, once no bed uses it
        ETC_NETNS.rmdir()


def destroy(bed: Bed, lock: int) -> None:
    try:
        destroy_names(bed.id)
    finally:
        os.close(lock)


def leftovers(bed_id: str) -> list[str]:
    """What of bed ``bed_id`` still exists (empty after :func:`destroy`)."""
    bridge, netns, veth = names(bed_id)
    links = run("ip", "-o", "link", "show").stdout
    found = [name for name in (bridge, *veth.values()) if re.search(rf"\b{name}[@:]", links)]
    listed = set(run("ip", "netns", "list").stdout.split())
    found += [ns for ns in netns.values() if ns in listed or (ETC_NETNS / ns).exists()]
    return found + ([str(STATE / bed_id)] if (STATE / bed_id).exists() else [])


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


ID = r"(\d+)s\d+"


def stale_beds() -> list[str]:
    """Ids of beds whose creator is gone: no one holds their lock (or, lockless, the pid is dead)."""
    found = {m.group(1) for ns in run("ip", "netns", "list").stdout.split()
             if (m := re.fullmatch(rf"{NETNS_PREFIX}({ID})-[{''.join(NODE_NAMES)}]", ns))}  # fmt: skip
    if STATE.exists():
        found |= {p.name for p in STATE.iterdir() if re.fullmatch(ID, p.name)}
    return [bed_id for bed_id in sorted(found) if not held(bed_id)]


def held(bed_id: str) -> bool:
    try:
        fd = os.open(STATE / bed_id / "lock", os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:  # being created or torn down by a live process, or left by a dead one
        match = re.fullmatch(ID, bed_id)
        return match is not None and alive(int(match.group(1)))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True  # a live bed (this or another test run): leave it alone
    finally:
        os.close(fd)
    return False


def sweep_stale() -> list[str]:
    """Tear down every bed left by a dead run; returns their ids."""
    stale = stale_beds()
    for bed_id in stale:
        destroy_names(bed_id)
    return stale


@contextlib.contextmanager
def bed() -> Iterator[Bed]:
    """A bed for the ``with`` body (stale beds swept first), torn down after it whatever happens."""
    sweep_stale()
    made, lock = create()
    try:
        yield made
    finally:
        destroy(made, lock)
