"""A real object store on loopback: one-node OpenStack Swift with its S3 API (s3api).

moto is a mock; Swift is a production object store that refuses what real stores refuse.
:class:`SwiftServer` lays out a one-replica Swift (account, container, object and proxy
servers with s3api + tempauth + memcached) under a temporary directory on 127.0.0.1 with
free ports, waits until a *signed* S3 request succeeds, and stops exactly the processes it
started. Each process runs in its own session (a Swift parent kills its whole process group
on SIGTERM), and stopping kills each session by its id, never by name.

Swift comes from Debian packages (:data:`PACKAGES`) and runs on the system interpreter
(``/usr/bin/python3``), not on the caller's venv. ``python -m asyncckpt.servers.embedded_swift``
is the command line (start/stop/status/run).
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..env import child_environ
from ..errors import AsyncCkptError
from ._swift_layout import RING_SCRIPT, SERVERS, render_configs
from .s3endpoint import S3Endpoint

PACKAGES = ("swift", "swift-proxy", "swift-object", "swift-container", "swift-account", "memcached")
SYSTEM_PYTHON = "/usr/bin/python3"
ACCESS_KEY = "test:tester"
#: tempauth test-only password; distinctive so tests can assert it never leaks into output
SECRET_KEY = "swift-test-secret-Hq4zN7"
REGION = "us-east-1"
#: how Swift's S3 API differs from AWS (keys documented in asyncckpt.servers.s3compat)
QUIRKS = frozenset(
    {"delete-objects-needs-md5", "no-partnumber-get", "checksums-ignored", "no-aws-chunked", "full-is-503"}
)


class EmbeddedServerError(AsyncCkptError, RuntimeError):
    """A local S3 server could not be installed, started or stopped."""


class SwiftUnavailableError(EmbeddedServerError):
    """Swift is not installed and cannot be installed here (not root, or no apt-get)."""


def missing_packages() -> list[str]:
    """The Debian packages whose programs are absent (empty when Swift can run)."""
    missing = [f"swift-{s}" for s in SERVERS if not Path(f"/usr/bin/swift-{s}-server").exists()]
    if shutil.which("memcached") is None:
        missing.append("memcached")
    if not Path(SYSTEM_PYTHON).exists() or (
        subprocess.run([SYSTEM_PYTHON, "-c", "import swift"], capture_output=True).returncode != 0
    ):
        missing.append("swift")
    return missing


def ensure_installed(install: bool = True) -> None:
    """Install the Debian packages when missing (root with apt-get only), else explain."""
    missing = missing_packages()
    if not missing:
        return
    why = f"Swift packages missing ({', '.join(missing)})"
    if not install:
        raise SwiftUnavailableError(f"{why}; install: apt-get install {' '.join(PACKAGES)}")
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise SwiftUnavailableError(
            f"{why} and cannot install them here (needs root and apt-get); "
            f"run as root: apt-get update && apt-get install -y --no-install-recommends {' '.join(PACKAGES)}"
        )
    env = child_environ(DEBIAN_FRONTEND="noninteractive")
    for cmd in (
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *PACKAGES],
    ):
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise SwiftUnavailableError(f"{' '.join(cmd)} failed: {done.stderr.strip()[-500:]}")
    if still := missing_packages():
        raise SwiftUnavailableError(f"Swift packages still missing after apt-get install: {still}")


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports the OS considers free on 127.0.0.1 right now."""
    import socket

    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def group_members(pgid: int) -> list[int]:
    """PIDs whose process group is ``pgid`` (reads /proc; the group outlives its leader)."""
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if fields[0] != "Z" and int(fields[2]) == pgid:
                members.append(int(entry))
    return members


def kill_session(pid: int, marker: str, timeout: float = 10.0) -> None:
    """SIGTERM the process group led by ``pid`` (then SIGKILL), if it is still ours.

    ``marker`` must appear in the leader's command line (our temporary directory), so a
    recycled PID is never signalled.
    """
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        cmdline = ""
    if cmdline and marker not in cmdline:
        return  # the PID now belongs to someone else
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout
        while group_members(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        if not group_members(pid):
            return


@dataclass
class SwiftServer:
    """One-node Swift + s3api on 127.0.0.1; a context manager yielding an :class:`S3Endpoint`.

    ``tmpfs_size`` (bytes, root only) puts the object data on a tmpfs of that size, for
    full-disk tests. ``workers`` is the proxy and object server worker count. Unless
    ``detach``, each server gets SIGTERM when the thread that started it dies (``setpriv
    --pdeathsig``), so a killed test run leaves nothing behind; ``detach=True`` (the CLI's
    ``start``) lets the servers outlive the starting process. ``host``: the address the S3
    endpoint (the proxy) binds, another local address such as a bridge that network
    namespaces reach (tests/nodes.py); the servers behind it stay on 127.0.0.1.
    """

    workers: int = 1
    tmpfs_size: int | None = None
    log_level: str = "WARNING"
    install: bool = True
    detach: bool = False
    root: Path | None = None
    host: str = "127.0.0.1"
    pids: dict[str, int] = field(default_factory=dict)
    endpoint: S3Endpoint | None = None
    _procs: list[subprocess.Popen[bytes]] = field(default_factory=list, repr=False)

    def __enter__(self) -> S3Endpoint:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def devices(self) -> Path:
        assert self.root is not None
        return self.root / "srv"

    def start(self, timeout: float = 30.0) -> S3Endpoint:
        """Install if needed, lay out, launch, and wait for a signed S3 request to succeed."""
        if self.tmpfs_size is not None and os.geteuid() != 0:
            raise SwiftUnavailableError("a tmpfs data dir (tmpfs_size) needs root to mount")
        ensure_installed(self.install)
        for attempt in range(3):
            self.root = Path(tempfile.mkdtemp(prefix="asyncckpt-swift-"))
            try:
                return self._launch(timeout)
            except EmbeddedServerError as exc:
                self.stop()
                # the free ports were picked before binding: another process may take one first
                if (
                    not any(m in str(exc) for m in ("Address already in use", "Could not bind"))
                    or attempt == 2
                ):
                    raise
            except BaseException:
                self.stop()
                raise
        raise AssertionError("unreachable")

    def _launch(self, timeout: float) -> S3Endpoint:
        assert self.root is not None
        etc, logs = self.root / "etc", self.root / "log"
        for d in (etc, logs, self.devices):
            d.mkdir()
        if self.tmpfs_size is not None:
            opts = f"size={self.tmpfs_size},mode=0755"
            try:
                self._run(["mount", "-t", "tmpfs", "-o", opts, "asyncckpt-swift", self.devices])
            except EmbeddedServerError as exc:  # e.g. a container without CAP_SYS_ADMIN
                raise SwiftUnavailableError(f"cannot mount a tmpfs for the data: {exc}") from None
        (self.devices / "d1").mkdir()
        _check_xattrs(self.devices / "d1")
        ports = dict(zip(("memcached", *SERVERS), free_ports(1 + len(SERVERS)), strict=True))
        user = pwd.getpwuid(os.geteuid()).pw_name
        for name, text in render_configs(
            etc, self.devices, ports, user, self.workers, self.log_level, SECRET_KEY, REGION, self.host
        ).items():
            (etc / name).write_text(text)
        self._run([SYSTEM_PYTHON, "-c", RING_SCRIPT, str(etc), str(ports["account"]),
                   str(ports["container"]), str(ports["object"])])  # fmt: skip
        memcached = ["memcached", "-l", "127.0.0.1", "-p", str(ports["memcached"]), "-U", "0", "-m", "64"]
        memcached += ["-P", str(self.root / "memcached.pid")] + (["-u", user] if os.geteuid() == 0 else [])
        self._spawn("memcached", memcached, logs)
        for name in SERVERS:
            argv = [SYSTEM_PYTHON, f"/usr/bin/swift-{name}-server", str(etc / f"{name}-server.conf"), "-v"]
            self._spawn(name, argv, logs)
        ep = S3Endpoint(
            "swift", f"http://{self.host}:{ports['proxy']}", ACCESS_KEY, SECRET_KEY, REGION, QUIRKS
        )
        deadline = time.monotonic() + timeout
        while not ep.ready():
            self._check_alive(logs)
            if time.monotonic() > deadline:
                raise EmbeddedServerError(f"Swift not ready after {timeout:.0f} s; logs: {self._tail(logs)}")
            time.sleep(0.05)
        self.endpoint = ep
        return ep

    def _run(self, argv: list[Any]) -> None:
        done = subprocess.run([str(a) for a in argv], capture_output=True, text=True)
        if done.returncode != 0:
            raise EmbeddedServerError(f"{argv[0]} failed: {(done.stderr or done.stdout).strip()[-800:]}")

    def _spawn(self, name: str, argv: list[str], logs: Path) -> None:
        if not self.detach and shutil.which("setpriv"):
            argv = ["setpriv", "--pdeathsig", "TERM", "--", *argv]  # exec'd: the PID stays the server's
        with open(logs / f"{name}.log", "wb") as log:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self._procs.append(proc)
        self.pids[name] = proc.pid

    def _check_alive(self, logs: Path) -> None:
        for name, proc in zip(self.pids, self._procs, strict=True):
            if proc.poll() is not None:
                raise EmbeddedServerError(
                    f"{name} exited with {proc.returncode} during start; logs: {self._tail(logs)}"
                )

    @staticmethod
    def _tail(logs: Path) -> str:
        texts = {p.name: p.read_text(errors="replace")[-400:].strip() for p in sorted(logs.glob("*.log"))}
        return " ".join(f"[{name}] {text}" for name, text in texts.items() if text) or "(empty)"

    def state(self) -> dict[str, Any]:
        """What :func:`stop_state` needs to stop this server from another process."""
        assert self.root is not None and self.endpoint is not None
        return {"root": str(self.root), "pids": self.pids, "endpoint": self.endpoint.endpoint}

    def stop(self) -> None:
        """Stop every session we started, unmount the tmpfs, remove the directory. Idempotent."""
        if self.root is not None:
            stop_state({"root": str(self.root), "pids": self.pids})
        for proc in self._procs:
            proc.wait(timeout=5)  # reap our children (already gone: no zombies left)
        self._procs.clear()
        self.pids, self.root, self.endpoint = {}, None, None


def stop_state(state: dict[str, Any]) -> None:
    """Stop a server described by :meth:`SwiftServer.state` (servers first, memcached last)."""
    root = Path(state["root"])
    pids: dict[str, int] = dict(state.get("pids", {}))
    for name in (*reversed(SERVERS), "memcached"):
        if pids.get(name):
            kill_session(pids[name], str(root))
    devices = root / "srv"
    if os.path.ismount(devices):  # our tmpfs (the directory is ours, inside our temp dir)
        subprocess.run(["umount", str(devices)], check=False, capture_output=True)
    if os.path.ismount(devices):
        raise EmbeddedServerError(f"could not unmount {devices}; remove it by hand")
    shutil.rmtree(root, ignore_errors=True)


def _check_xattrs(path: Path) -> None:
    try:
        os.setxattr(path, "user.asyncckpt.probe", b"1")
        os.removexattr(path, "user.asyncckpt.probe")
    except OSError as exc:
        raise EmbeddedServerError(f"Swift needs user xattrs; {path} refused them ({exc.strerror})") from None
