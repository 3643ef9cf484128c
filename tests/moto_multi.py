"""Several moto S3 endpoints sharing one store, in a child process (``python -m tests.moto_multi N``).

ThreadedMotoServer instances in one process share moto's in-memory store, so they behave as
front ends of one object store — what multi-endpoint routing targets. They run in a child
process so their request handling does not hold the test process's GIL (which the
blocking-call detector would blame on the code under test). Prints ``ENDPOINTS url,url,...``
once all listen; exits when stdin closes.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def started(count: int) -> Iterator[list[str]]:
    """The URLs of ``count`` endpoints served by a child process, stopped on exit."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.moto_multi", str(count)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert proc.stdout is not None and proc.stdin is not None
    try:
        line = proc.stdout.readline()
        assert line.startswith("ENDPOINTS "), line
        yield line.split()[1].split(",")
    finally:
        proc.stdin.close()
        proc.wait(timeout=10)


def main() -> None:
    from moto.server import ThreadedMotoServer  # only in the child: a second or more to import

    count = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    servers = [ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False) for _ in range(count)]
    for s in servers:
        s.start()
    urls = [f"http://{h}:{p}" for h, p in (s.get_host_and_port() for s in servers)]
    print("ENDPOINTS " + ",".join(urls), flush=True)
    sys.stdin.read()
    for s in servers:
        s.stop()


if __name__ == "__main__":
    main()
