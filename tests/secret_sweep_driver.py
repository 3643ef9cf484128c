"""Run by tests/test_secret_sweep.py in a fresh interpreter: one backend, one failure mode.

Everything a user could see goes to this process's stdout/stderr: reprs of the config, the
S3 settings and the result, the JSON result, every exception in the chain (str, repr, args,
``__cause__``/``__context__``, formatted traceback), all logging at DEBUG (every logger,
third-party ones included), and a run of the benchmark CLI with the secret in the
environment (its stdout, stderr and ``--json`` file). The parent greps all of it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

from asyncckpt import AsyncCheckpointer, CheckpointConfig
from asyncckpt.bench import cli
from asyncckpt.sinks.s3.config import S3Settings

CHUNK = 5 * 2**20


def exception_texts(exc: BaseException) -> list[str]:
    """Everything printable about ``exc`` and the exceptions behind it."""
    out: list[str] = ["".join(traceback.format_exception(exc))]
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        out += [
            type(e).__name__,
            str(e),
            repr(e),
            repr(e.args),
            repr(vars(e) if hasattr(e, "__dict__") else ""),
        ]
        todo += [e.__cause__, e.__context__]
    return out


async def library_run(config: CheckpointConfig, uri: str) -> str:
    async with AsyncCheckpointer(config) as ckpt:
        try:
            result = await ckpt.save(uri, CHUNK + 1)
            print(result, repr(result), json.dumps(result.to_dict(include_records=True), default=repr))
            loaded = await ckpt.load(uri)
            print(loaded, repr(loaded), json.dumps(loaded.to_dict(), default=repr))
            await ckpt.delete(uri)
        except Exception as exc:
            print("\n".join(exception_texts(exc)))
            return type(exc).__name__
    return "saved"


def main() -> None:
    spec: dict[str, Any] = json.loads(sys.argv[1])
    logging.basicConfig(level=logging.DEBUG, stream=sys.stderr, format="%(name)s %(levelname)s %(message)s")
    options = {
        "endpoint_url": spec["endpoint"],
        "access_key_id": spec["access_key"],
        "secret_access_key": spec["secret"],
        "region": "us-east-1",
        "dotenv": False,
        **spec.get("extra", {}),
    }
    config = CheckpointConfig(
        chunk_size=CHUNK, num_buffers=2, backend=spec["backend"], backend_options=options
    )
    print(repr(config), str(config), repr(config.backend_options))
    settings = S3Settings.resolve(config.backend_options)
    print(repr(settings), str(settings), settings.describe())
    outcome = asyncio.run(library_run(config, spec["uri"]))
    print(f"LIBRARY-OUTCOME {outcome}")
    # the CLI, with the secret where AWS users put it: the environment
    os.environ.update(
        {
            "AWS_ENDPOINT_URL": spec["endpoint"],
            "AWS_ACCESS_KEY_ID": spec["access_key"],
            "AWS_SECRET_ACCESS_KEY": spec["secret"],
            "AWS_REGION": "us-east-1",
        }
    )
    if spec.get("extra", {}).get("session_token"):
        os.environ["AWS_SESSION_TOKEN"] = spec["extra"]["session_token"]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        argv = [spec["uri"], "--size", str(CHUNK + 1), "--chunk-size", "5MiB", "--backend", spec["backend"]]
        code = cli.main([*argv, "--json", str(out), "-v"])
        print(f"CLI-EXIT {code}")
        if out.exists():
            print(out.read_text())


if __name__ == "__main__":
    main()
