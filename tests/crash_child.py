"""A save that a test kills: ``python crash_child.py TARGET SIZE SEED STEP N [CHUNK [OPTIONS]]``.

STEP names a system call of the file save (``open``, ``pwrite``, ``fsync``, ``link`` (the old
file linked aside), ``replace``, ``unlink`` (the aside name dropped after the save returned));
the process SIGKILLs itself as the N-th such call begins, in whichever thread makes it, so the
crash lands exactly at that step of the real code. STEP ``none`` runs the save to the end
(the parent then kills it at a chosen instant, or when its relay sees a chosen request).
The line ``saving`` on stdout marks the start. CHUNK is the chunk size in bytes (1 MiB);
OPTIONS a JSON object of backend options (S3 targets).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import threading
from typing import Any

from asyncckpt import AsyncCheckpointer
from asyncckpt.units import MiB

CHUNK = 1 * MiB
STEPS = {
    "open": os.open,
    "pwrite": os.pwrite,
    "fsync": os.fsync,
    "link": os.link,
    "replace": os.replace,
    "unlink": os.unlink,
}


def arm(step: str, nth: int) -> None:
    if step == "none":
        return
    target, seen = STEPS[step], [0]
    lock = threading.Lock()

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "c_call" and arg is target:
            with lock:
                seen[0] += 1
                if seen[0] == nth:
                    os.kill(os.getpid(), signal.SIGKILL)

    threading.setprofile(profile)  # executor threads start after this
    sys.setprofile(profile)


async def main(
    target: str, size: int, seed: int, step: str, nth: int, chunk: int, options: dict[str, Any]
) -> None:
    backend = "aiobotocore" if target.startswith("s3://") else None
    async with AsyncCheckpointer(
        chunk_size=chunk, num_buffers=3, seed=seed, backend=backend, backend_options=options
    ) as ckpt:
        print("saving", flush=True)
        arm(step, nth)
        await ckpt.save(target, size)
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
    print("saved", flush=True)


if __name__ == "__main__":
    path, nbytes, seed_, step_, nth_ = sys.argv[1:6]
    chunk_ = int(sys.argv[6]) if len(sys.argv) > 6 else CHUNK
    options_ = json.loads(sys.argv[7]) if len(sys.argv) > 7 else {}
    asyncio.run(main(path, int(nbytes), int(seed_), step_, int(nth_), chunk_, options_))
