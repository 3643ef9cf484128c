"""Run by tests/test_azure.py in a fresh interpreter: the secret sweep of ``az://``.

A distinctive account key or SAS token (``spec["secret"]``) goes in through backend_options and
then through the environment for the CLI; every channel (reprs of the config and settings,
exception chains, DEBUG logs of every logger, the CLI's output and JSON) goes to this
process's stdout/stderr, which the parent greps.
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

from asyncckpt import CheckpointConfig
from asyncckpt.bench import cli
from asyncckpt.sinks.azure.config import AzureSettings

from .secret_sweep_driver import CHUNK, library_run

#: backend option → the variable the CLI run reads it from
VARIABLES = {
    "account": "AZURE_STORAGE_ACCOUNT",
    "account_key": "AZURE_STORAGE_KEY",
    "sas_token": "AZURE_STORAGE_SAS_TOKEN",
    "endpoint_url": "AZURE_STORAGE_ENDPOINT",
}


def main() -> None:
    spec: dict[str, Any] = json.loads(sys.argv[1])
    logging.basicConfig(level=logging.DEBUG, stream=sys.stderr, format="%(name)s %(levelname)s %(message)s")
    options = {**spec["options"], "max_attempts": 1}
    config = CheckpointConfig(chunk_size=CHUNK, num_buffers=2, backend_options=options)
    print(repr(config), str(config), repr(config.backend_options))
    settings = AzureSettings.resolve(config.backend_options, env={})
    print(repr(settings), str(settings), settings.describe())
    print(f"LIBRARY-OUTCOME {asyncio.run(library_run(config, spec['uri']))}")
    os.environ.update({VARIABLES[k]: str(v) for k, v in spec["options"].items()})
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        code = cli.main(
            [spec["uri"], "--size", str(CHUNK + 1), "--chunk-size", "5MiB", "--json", str(out), "-v"]
        )
        print(f"CLI-EXIT {code}")
        if out.exists():
            print(out.read_text())


if __name__ == "__main__":
    main()
