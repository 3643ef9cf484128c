"""``--embedded-store azure|gcs``: an Azure Blob or GCS emulator for one bench run.

Starts Azurite or fake-gcs-server, creates :data:`BENCH_CONTAINER`, exports the variables the
Azure/GCS clients read (the emulator's :meth:`env`) for the run, and returns the default
target. Whether the target can be run is the router's answer, asked after this.
"""

from __future__ import annotations

import contextlib
import sys

from .. import modes
from ..env import exported
from .azurite import AzuriteServer
from .gcs_emulator import GcsEmulator

BENCH_CONTAINER = "asyncckpt-bench"
#: the URI scheme of each store
SCHEMES: dict[modes.EmbeddedStore, str] = {"azure": "az", "gcs": "gs"}


def start_store_for_bench(stack: contextlib.ExitStack, kind: modes.EmbeddedStore) -> str:
    """Start ``kind`` (stopped when ``stack`` closes), create the container or bucket, export
    its settings for the run; return the default target."""
    if kind == "azure":
        az = stack.enter_context(AzuriteServer())
        az.create_container(BENCH_CONTAINER)
        stack.enter_context(exported(az.env()))
        where = f"Azurite at {az.blob_url}, account {az.account}, container {BENCH_CONTAINER}"
    else:
        gcs = stack.enter_context(GcsEmulator())
        gcs.create_bucket(BENCH_CONTAINER)
        stack.enter_context(exported(gcs.env()))
        where = f"fake-gcs-server at {gcs.url}, bucket {BENCH_CONTAINER}"
    print(f"[asyncckpt] embedded {kind} store: {where}", file=sys.stderr)
    return f"{SCHEMES[kind]}://{BENCH_CONTAINER}/checkpoint.bin"
