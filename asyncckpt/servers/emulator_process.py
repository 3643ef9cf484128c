"""One emulator process: a temporary directory, a free port, readiness by polling, a clean stop.

Shared by the Azurite and fake-gcs-server wrappers. The process runs in its own session (so
stopping it signals its whole group, children included, by the group's id and never by
name) with ``setpriv --pdeathsig`` unless detached, so a killed test run leaves nothing behind.
A marker from its command line (the temporary directory, or the port when the server takes no
directory) is checked by :func:`.embedded_swift.kill_session` before signalling, so a recycled
PID is never hit.
"""

from __future__ import annotations

import abc
import asyncio
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Generic, TypeVar

from .embedded_swift import EmbeddedServerError, free_ports, kill_session

E = TypeVar("E")
#: what a server prints when the port it was given was taken between choosing and binding
PORT_TAKEN = ("EADDRINUSE", "address already in use", "Address already in use")
START_ATTEMPTS = 3


class EmulatorUnavailableError(EmbeddedServerError):
    """The emulator (or what runs it) is not installed; the message says how to install it."""


class ChildServer:
    """A server process started in ``root`` (a fresh temporary directory); stop() removes both."""

    def __init__(self, name: str, root: Path, *, detach: bool = False) -> None:
        self.name, self.root, self.detach = name, root, detach
        self.proc: subprocess.Popen[bytes] | None = None
        #: text of the server's command line that proves a PID is still ours
        self.marker = str(root)

    @property
    def log(self) -> Path:
        return self.root / f"{self.name}.log"

    def spawn(self, argv: Sequence[str], env: dict[str, str] | None = None) -> None:
        if not self.detach and shutil.which("setpriv"):
            argv = ["setpriv", "--pdeathsig", "TERM", "--", *argv]  # exec'd: the PID stays the server's
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=env,
            )

    def tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-800:].strip() or "(empty log)"
        except OSError:
            return "(no log)"

    def wait_ready(self, probe: Callable[[], bool], timeout: float) -> None:
        """Poll ``probe`` (a real request) until it succeeds; fail at once if the process exits."""
        deadline = time.monotonic() + timeout
        delay = 0.02
        while not probe():
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise EmbeddedServerError(
                    f"{self.name} exited with {self.proc.returncode} during start: {self.tail()}"
                )
            if time.monotonic() > deadline:
                raise EmbeddedServerError(f"{self.name} not ready after {timeout:.0f} s: {self.tail()}")
            time.sleep(delay)  # a start-up poll, off any event loop (async callers use a thread)
            delay = min(delay * 2, 0.2)

    def stop(self) -> None:
        """Stop the session (SIGTERM, then SIGKILL), reap it, remove the directory. Idempotent."""
        if self.proc is not None:
            kill_session(self.proc.pid, self.marker)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:  # not ours any more? kill the leader itself
                self.proc.kill()
                self.proc.wait()
            self.proc = None
        shutil.rmtree(self.root, ignore_errors=True)


def start_with_free_port(
    name: str,
    launch: Callable[[ChildServer, int], E],
    *,
    detach: bool = False,
    attempts: int = START_ATTEMPTS,
) -> tuple[ChildServer, E]:
    """Run ``launch(child, port)`` in a fresh temporary directory with a free port; retry when
    the port was taken before the server bound it. On failure nothing is left behind."""
    for attempt in range(attempts):
        root = Path(tempfile.mkdtemp(prefix=f"asyncckpt-{name}-"))
        child = ChildServer(name, root, detach=detach)
        try:
            return child, launch(child, free_ports(1)[0])
        except EmbeddedServerError as exc:
            child.stop()
            if attempt == attempts - 1 or not any(m in str(exc) for m in PORT_TAKEN):
                raise
        except BaseException:
            child.stop()
            raise
    raise AssertionError("unreachable")


class AsyncServer(abc.ABC, Generic[E]):
    """``with server as ep`` and ``async with server as ep`` (starting in a thread, off the loop).

    Unless detached, the server gets SIGTERM when the *thread* that started it ends: with
    ``async with`` that is a thread of the loop's default executor, which lives until the loop
    closes, so leave the block before the loop ends (``asyncio.run`` does that in order).
    """

    @abc.abstractmethod
    def start(self) -> E:
        """Start the server and return how to reach it."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Stop what start() started; idempotent."""

    def __enter__(self) -> E:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> E:
        return await asyncio.to_thread(self.start)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await asyncio.to_thread(self.stop)


@dataclass
class ChildEmulator(AsyncServer[E]):
    """An emulator that runs as one :class:`ChildServer` on a free port: what its stop, pid
    and port search share (each subclass says how to launch and probe it)."""

    detach: bool = False
    endpoint: E | None = None
    child: ChildServer | None = field(default=None, repr=False)

    def run(self, name: str, launch: Callable[[ChildServer, int], E]) -> E:
        """Start ``launch`` on a free port (retried on a port taken meanwhile); the endpoint."""
        self.child, endpoint = start_with_free_port(name, launch, detach=self.detach)
        self.endpoint = endpoint
        return endpoint

    def stop(self) -> None:
        if self.child is not None:
            self.child.stop()
        self.child, self.endpoint = None, None

    @property
    def pid(self) -> int | None:
        """The server's process id (its session and group id too) while running."""
        proc = self.child.proc if self.child is not None else None
        return proc.pid if proc is not None else None
