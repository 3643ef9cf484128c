"""Command line of the local Swift S3 server:
``python -m asyncckpt.servers.swift start|stop|status|run``.

``start`` leaves the server running after it returns and records what it started in a state
file; ``stop`` stops exactly those processes. Both are idempotent. ``start`` prints
``AWS_ENDPOINT_URL=…`` style lines (``--export`` for ``eval "$(…)"``); the credentials are
tempauth's test-only ones. ``run -- CMD`` starts, runs CMD with those variables, and stops.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..env import child_environ
from ..errors import AsyncCkptError
from ..units import parse_size
from .embedded_swift import ACCESS_KEY, QUIRKS, REGION, SECRET_KEY, SwiftServer, stop_state
from .s3endpoint import S3Endpoint

DEFAULT_STATE = Path(tempfile.gettempdir()) / f"asyncckpt-swift-{os.getuid()}.json"


def _load(state_file: Path) -> dict[str, Any] | None:
    try:
        state: dict[str, Any] = json.loads(state_file.read_text())
    except FileNotFoundError:
        return None
    return state


def _endpoint(state: dict[str, Any]) -> S3Endpoint:
    return S3Endpoint("swift", state["endpoint"], ACCESS_KEY, SECRET_KEY, REGION, QUIRKS)


def _print_env(ep: S3Endpoint, export: bool) -> None:
    for key, value in ep.env().items():
        print(f"{'export ' if export else ''}{key}={value}")


def _stop(state_file: Path) -> bool:
    state = _load(state_file)
    if state is None:
        return False
    stop_state(state)
    state_file.unlink(missing_ok=True)
    return True


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m asyncckpt.servers.swift", description="Start or stop a local Swift S3 server."
    )
    p.add_argument("command", choices=("start", "stop", "status", "run"))
    p.add_argument("--state", type=Path, default=DEFAULT_STATE, help=f"state file ({DEFAULT_STATE})")
    p.add_argument("--workers", type=int, default=1, help="proxy and object server workers (1)")
    p.add_argument("--tmpfs-size", default=None, help="put the data on a tmpfs of this size (root)")
    p.add_argument("--bucket", default=None, help="also create this bucket")
    p.add_argument("--export", action="store_true", help="print 'export K=V' lines")
    p.add_argument("--no-install", action="store_true", help="fail instead of apt-get installing Swift")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    args = build_parser().parse_args(argv[:cut])
    args.argv = argv[cut + 1 :]
    try:
        return _main(args)
    except AsyncCkptError as exc:
        print(f"asyncckpt.servers.swift: error: {exc}", file=sys.stderr)
        return 1


def _main(args: argparse.Namespace) -> int:
    state = _load(args.state)
    if args.command == "stop":
        print("stopped" if _stop(args.state) else "not running", file=sys.stderr)
        return 0
    if args.command == "status":
        running = state is not None and _endpoint(state).ready()
        print(f"running at {state['endpoint']}" if running and state else "not running")
        return 0 if running else 3
    server = SwiftServer(
        workers=args.workers,
        tmpfs_size=None if args.tmpfs_size is None else parse_size(args.tmpfs_size, name="--tmpfs-size"),
        install=not args.no_install,
        detach=args.command == "start",
    )
    if args.command == "run":
        cmd = args.argv
        if not cmd:
            print("asyncckpt.servers.swift: error: run needs a command after --", file=sys.stderr)
            return 2
        with server as ep:
            if args.bucket:
                ep.create_bucket(args.bucket)
            return subprocess.call(cmd, env=child_environ(**ep.env()))
    if state is not None and _endpoint(state).ready():
        ep = _endpoint(state)  # already running: idempotent start
    else:
        _stop(args.state)  # remnants of a dead server
        ep = server.start()
        args.state.write_text(json.dumps(server.state()))
        args.state.chmod(0o600)
    if args.bucket:
        status, _ = ep.request("HEAD", f"/{args.bucket}")
        if status != 200:
            ep.create_bucket(args.bucket)
    _print_env(ep, args.export)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
