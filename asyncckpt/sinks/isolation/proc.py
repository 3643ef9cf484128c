"""Starting, describing and reaping writer processes."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import signal
import sys
import threading
from multiprocessing.process import BaseProcess

#: exit code of a process that stopped because it was re-running an unguarded script's body
UNGUARDED_MAIN_EXIT = 78
GUARD = 'if __name__ == "__main__":'


def main_script() -> str:
    main = sys.modules.get("__main__")
    return str(getattr(main, "__file__", None) or "the main module")


def rerun_script() -> str | None:
    """The script whose body this call comes from when that body is being re-run as
    ``__mp_main__``: spawn and forkserver re-import the main module in each new process, and a
    script without the ``__main__`` guard then runs its whole body again there."""
    frame = inspect.currentframe()
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") == "__mp_main__":
            return str(frame.f_globals.get("__file__") or "the main module")
        frame = frame.f_back
    return None


def refuse_unguarded_main() -> None:
    """Stop, with one line, a writer start from a script body being re-run by multiprocessing
    (which would otherwise fail with its long "bootstrapping phase" RuntimeError)."""
    script = rerun_script()
    if script is not None:
        print(
            f"asyncckpt: {script} has no {GUARD} guard: a writer process (spawn/forkserver) "
            "re-imports it and ran its whole body again; put the code that saves under that guard",
            file=sys.stderr,
        )
        raise SystemExit(UNGUARDED_MAIN_EXIT)


def exit_text(code: int | None) -> str:
    if code == UNGUARDED_MAIN_EXIT:
        return f"stopped: {main_script()} has no {GUARD} guard and re-ran its body in the writer"
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
