"""SIGTERM ends a bench run the way Ctrl-C does.

Schedulers (Slurm, Kubernetes, ``timeout``) stop a job with SIGTERM, whose default action
kills the process on the spot and leaves every checkpoint it wrote behind. While the CLI runs,
SIGTERM is handed to whatever handles SIGINT: inside ``asyncio.run`` that cancels the main
task, so every ``finally`` removes what the run wrote; elsewhere it raises
``KeyboardInterrupt``. The CLI then says which signal ended it and exits 128 + its number.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

from ..node.distributed import Comm
from ..owner import owned_dir_prefix, parse_owned_dir


class Interrupt:
    """The signal that ended the run: SIGINT unless SIGTERM came."""

    def __init__(self) -> None:
        self.signum = signal.SIGINT

    @property
    def exit_code(self) -> int:
        return 128 + int(self.signum)

    @property
    def message(self) -> str:
        return "terminated (SIGTERM)" if self.signum == signal.SIGTERM else "interrupted"


#: what ended the current run (one CLI run per process)
INTERRUPT = Interrupt()


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    INTERRUPT.signum = signal.SIGTERM
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):  # asyncio's while a loop runs (cancels the main task), else Python's
        handler(signal.SIGINT, frame)
    else:  # SIGINT ignored (a background job): SIGTERM must still end the run
        raise KeyboardInterrupt


@contextlib.contextmanager
def sigterm_as_sigint() -> Iterator[Interrupt]:
    """While inside, SIGTERM takes SIGINT's path; the previous handler is put back after."""
    INTERRUPT.signum = signal.SIGINT
    if threading.current_thread() is not threading.main_thread():  # handlers: main thread only
        yield INTERRUPT
        return
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        yield INTERRUPT
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """SIGINT and SIGTERM held back while inside (delivered, and so raised, on the way out):
    for steps that must not stop halfway, such as removing the run's directory, which a
    signal between its last file and the directory itself left behind, empty.

    The handlers are swapped for one that only records, rather than the signals blocked: a
    blocked mask is per thread, and the kernel hands a process's signal to any thread that
    does not block it (an executor's, a BLAS library's), where the default action ends the
    process and a Python handler still runs in the main thread. An ignored signal stays ignored."""
    if threading.current_thread() is not threading.main_thread():  # handlers: main thread only
        yield
        return
    caught: list[int] = []

    def record(signum: int, frame: FrameType | None) -> None:
        caught.append(signum)

    previous = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        handler = signal.getsignal(signum)
        if handler is not signal.SIG_IGN and handler is not None:  # None: set outside Python
            previous[signum] = signal.signal(signum, record)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for held in dict.fromkeys(caught):  # each once, in arrival order, to its own handler
            signal.raise_signal(held)


def make_temporary(prefix: str) -> str:
    """A new temporary directory, made with SIGINT and SIGTERM held back, so that a signal
    cannot fall between its creation and the caller's record of it. Its name records this
    process; what a killed run (SIGKILL, the OOM killer) left under ``prefix`` goes first."""
    collect_abandoned(prefix)
    with deferred():
        return tempfile.mkdtemp(prefix=owned_dir_prefix(prefix))


def collect_abandoned(prefix: str) -> None:
    """Remove the temporary directories of runs that died without removing them (a run always
    removes its own at its end, ``--keep`` or not): only directories of this user, host and
    boot whose process is gone, as the owner rule says. A killed 1 GiB save left its 1 GiB
    in the temporary folder, often a file system in memory, until the machine restarted."""
    base = tempfile.gettempdir()
    try:
        entries = list(os.scandir(base))
    except OSError:
        return
    for entry in entries:
        owner = parse_owned_dir(prefix, entry.name)
        if owner is None or not owner.provably_dead():
            continue
        try:
            if (
                not entry.is_dir(follow_symlinks=False)
                or entry.stat(follow_symlinks=False).st_uid != os.getuid()
            ):
                continue
        except OSError:
            continue
        size = sum(
            f.stat().st_size for f in Path(entry.path).rglob("*") if f.is_file() and not f.is_symlink()
        )
        remove_temporary(entry.path)
        print(
            f"[asyncckpt] removed {entry.path} ({size / 2**20:.1f} MiB), left by a run that was killed"
            f" (pid {owner.pid})",
            file=sys.stderr,
        )


def remove_temporary(path: str) -> None:
    """Remove a directory this run made, as one step: a signal is delivered after, never
    between its last file and the directory itself."""
    with deferred():
        shutil.rmtree(path, ignore_errors=True)


def temporary_directory(stack: contextlib.ExitStack, prefix: str) -> str:
    """A new directory, removed when ``stack`` closes, however a signal falls: it is created
    and its removal registered as one step, and it is removed as one."""
    with deferred():
        path = make_temporary(prefix)
        stack.callback(remove_temporary, path)
    return path


def end_job_if_distributed(comm: Comm) -> None:
    """After an interrupted rank removed what it wrote: with other ranks, end the whole job,
    as they may wait at a collective this rank will not reach; alone, return (the caller
    re-raises and the CLI reports the signal)."""
    if comm.size > 1:
        print(f"asyncckpt.bench: rank {comm.rank}: {INTERRUPT.message}", file=sys.stderr)
        comm.abort(INTERRUPT.exit_code)
