"""Run by tests/test_gcs.py in a fresh interpreter: the secret sweep of ``gs://``.

A distinctive bearer token or service-account key (``spec["options"]``; a key from the file
``spec["key_file"]``, never from argv) goes in through backend_options and then through the
environment for the CLI (a key file: ``GOOGLE_APPLICATION_CREDENTIALS``, the store given with
``--endpoint`` so that the key is used); every channel (reprs of the config
and settings, exception chains, DEBUG logs of every logger, the CLI's output and JSON) goes to
this process's stdout/stderr, which the parent greps.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from asyncckpt import CheckpointConfig, ConfigError
from asyncckpt.bench import cli
from asyncckpt.secrets import protect_options
from asyncckpt.sinks.gcs import GcsSettings

from .secret_sweep_driver import CHUNK, exception_texts, library_run

#: backend option → the variable the CLI run reads it from
VARIABLES = {
    "token": "GOOGLE_OAUTH_ACCESS_TOKEN",
    "service_account_key": "GOOGLE_SERVICE_ACCOUNT_KEY",
    "endpoint_url": "STORAGE_EMULATOR_HOST",
}


def main() -> None:
    spec: dict[str, Any] = json.loads(sys.argv[1])
    logging.basicConfig(level=logging.DEBUG, stream=sys.stderr, format="%(name)s %(levelname)s %(message)s")
    key_file = spec.get("key_file")
    given = {**spec["options"]}
    if key_file:
        given["service_account_key"] = Path(key_file).read_text()
    options = {**given, "max_attempts": 1, "dotenv": False}
    try:  # a malformed key is refused as the config is made
        config = CheckpointConfig(chunk_size=CHUNK, num_buffers=2, backend_options=options)
    except ConfigError as exc:
        print("\n".join(exception_texts(exc)), repr(protect_options(options)))
        print(f"LIBRARY-OUTCOME {type(exc).__name__}")
    else:
        print(repr(config), str(config), repr(config.backend_options))
        try:
            settings = GcsSettings.resolve(config.backend_options, env={})
            print(repr(settings), str(settings), settings.describe())
        except ConfigError as exc:
            print("\n".join(exception_texts(exc)))
        print(f"LIBRARY-OUTCOME {asyncio.run(library_run(config, spec['uri']))}")
    # the CLI: the token where Google's tools read it, the endpoint as the emulator's variable
    # (with it a token is not sent at all; with only the token the requests would go to
    # storage.googleapis.com, so the CLI run keeps the endpoint as an option-free variable)
    flags: list[str] = []
    if key_file:
        os.environ["GOOGLE_APPLICATION_CREDENTIALS"] = key_file
        flags = ["--endpoint", spec["options"]["endpoint_url"]]
    else:
        os.environ.update({VARIABLES[k]: str(v) for k, v in spec["options"].items()})
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        code = cli.main(
            [spec["uri"], "--size", str(CHUNK + 1), "--chunk-size", "5MiB", "--json", str(out), "-v", *flags]
        )
        print(f"CLI-EXIT {code}")
        if out.exists():
            print(out.read_text())


if __name__ == "__main__":
    main()
