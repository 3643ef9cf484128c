"""A tiered run that a test kills: ``python -m tests.tiers_child LOCAL REMOTE POINT [N [OPTIONS]]``.

Step 1 is saved and drained to the end (the line ``step1`` on stdout says so); then step 2 is
saved, and the process SIGKILLs itself at POINT of step 2, in whichever thread gets there:

- ``local-write N``: as the N-th ``pwrite`` into the local step directory begins;
- ``local-commit``: just after the local ``COMMITTED.json`` is renamed into place;
- ``drain N``: as the N-th ``pwrite`` into the remote step directory begins (mid-drain);
- ``before-remote-commit`` / ``after-remote-commit``: just before / after the remote
  ``COMMITTED.json`` is renamed into place.

``os.pwrite`` and ``os.replace`` (the calls the file sink writes and publishes with) are
wrapped in this child only, so the kill lands at that exact point of the real code. POINT
``none`` runs to the end and prints ``done`` (an S3 remote's relay kills it instead); OPTIONS
is a JSON object of S3 ``backend_options``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from asyncckpt import CheckpointManager

MiB = 1 << 20
OPTIONS: dict[str, Any] = {"chunk_size": MiB, "num_buffers": 4}


def state_of(step: int) -> dict[str, Any]:
    return {"model": {"w": np.arange(3_000_000, dtype=np.float32) + step}, "step": step}  # 12 MB


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def arm(local: Path, remote: Path, point: str, nth: int) -> None:
    lock, seen = threading.Lock(), [0]
    real_pwrite: Callable[..., int] = os.pwrite
    real_replace: Callable[..., None] = os.replace
    under = {"local-write": local / "step-2", "drain": remote / "step-2"}.get(point)
    commit = {"local-commit": local, "before-remote-commit": remote, "after-remote-commit": remote}.get(point)

    def pwrite(fd: int, data: Any, offset: int) -> int:
        if under is not None and os.readlink(f"/proc/self/fd/{fd}").startswith(f"{under}/"):
            with lock:
                seen[0] += 1
                if seen[0] == nth:
                    die()
        return real_pwrite(fd, data, offset)

    def replace(src: Any, dst: Any) -> None:
        hit = commit is not None and Path(dst) == commit / "step-2" / "COMMITTED.json"
        if hit and point == "before-remote-commit":
            die()
        real_replace(src, dst)
        if hit:
            die()

    os.pwrite = pwrite
    os.replace = replace


async def main(local: Path, remote: str, point: str, nth: int, backend_options: dict[str, Any]) -> None:
    # an S3 remote: its client in this process (isolation="none"), so the kill ends every request
    s3 = {"chunk_size": 5 * MiB, "backend_options": backend_options, "isolation": "none"}
    options = {**OPTIONS, **s3} if backend_options else OPTIONS
    async with CheckpointManager(remote, local=local, keep_local=3, **options) as mgr:
        await mgr.maybe_save(1, state_of(1))
        await mgr.wait()
        print("step1", flush=True)
        if point != "none":
            arm(local, Path(remote), point, nth)
        await mgr.maybe_save(2, state_of(2))
        await mgr.wait()
    print("done", flush=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    options_ = json.loads(args[4]) if len(args) > 4 else {}
    asyncio.run(main(Path(args[0]), args[1], args[2], int(args[3]) if len(args) > 3 else 1, options_))
