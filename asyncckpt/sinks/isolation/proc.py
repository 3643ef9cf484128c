"""Starting, describing and reaping writer processes."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from multiprocessing.process import BaseProcess


def exit_text(code: int | None) -> str:
    if code is None:
        return "is still running"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by signal {signal.Signals(-code).name} (exit code {code})"
        return f"was killed by signal {-code}"
    return f"exited with code {code}" + (" (its traceback, if any, is on stderr)" if code else "")


def reap(proc: BaseProcess, grace: float) -> None:
    """Wait up to ``grace`` s for the child to exit, then kill it; always reaped."""
    proc.join(grace)
    if proc.exitcode is None:
        proc.kill()
        proc.join()


async def start_process(proc: BaseProcess) -> None:
    """``proc.start()`` off the loop, from a short-lived thread of its own.

    Not from an executor worker: a forked child's only thread would be a copy of that worker,
    and at exit ``concurrent.futures`` joins its workers, including the current thread, which
    raises and turns a clean exit into exit code 1.
    """
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def settle(exc: BaseException | None) -> None:
        if not done.done():
            done.set_exception(exc) if exc is not None else done.set_result(None)

    def target() -> None:
        try:
            proc.start()
        except BaseException as exc:
            loop.call_soon_threadsafe(settle, exc)
        else:
            loop.call_soon_threadsafe(settle, None)

    thread = threading.Thread(target=target, name="asyncckpt-start-writer", daemon=True)
    thread.start()
    try:
        await asyncio.shield(done)
    except asyncio.CancelledError:
        while not done.done():  # like run_blocking: never abandon a half-started child
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait([done])
        done.exception()
        raise
    finally:
        thread.join()  # it has already called back: returns at once


CHILD_MODULE = "asyncckpt.sinks.isolation.child"


def preload_in_forkserver() -> None:
    """Let the forkserver import the writer once, so each writer forks ready to run.

    Without it every forkserver child re-imports asyncckpt (≈ 0.3 s here, per save). Appends
    to the application's preload list rather than replacing it, and does nothing once the
    server runs. Importing is safe in the server: the fork hazard comes from *using* a
    runtime (s3dlio, dgen-py) before forking, which the server never does.
    """
    from multiprocessing import forkserver

    current = getattr(getattr(forkserver, "_forkserver", None), "_preload_modules", None)
    if isinstance(current, list) and CHILD_MODULE not in current:
        forkserver.set_forkserver_preload([*current, CHILD_MODULE])
