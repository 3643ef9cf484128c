"""Azure Blob on loopback: Azurite (Microsoft's own emulator, an npm package run by Node).

:class:`AzuriteServer` starts ``azurite-blob`` (blob service only) on 127.0.0.1 with a free
port, its workspace in a temporary directory and its data in memory (or in that directory),
waits until a SharedKey-signed request succeeds, and stops exactly the process group it
started. The account is Azurite's well-known development account (``devstoreaccount1`` and
its published key), held as a :class:`~asyncckpt.secrets.Secret`.

Azurite comes from npm, installed on first use into a cache directory
(``$XDG_CACHE_HOME/asyncckpt/azurite-VERSION``), never globally; Node and npm come from the
system (Debian: ``apt-get install nodejs npm``). ``python -m asyncckpt.servers.azurite install``
installs it ahead of time (the nox tests session does).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..env import AZURE_VARIABLES, cache_home, child_environ
from ..errors import AsyncCkptError, StorageError
from ..secrets import Secret
from .azure_auth import account_sas, shared_key_request
from .emulator_process import ChildEmulator, ChildServer, EmulatorUnavailableError
from .s3endpoint import RETRY_STATUSES, STARTUP_DEADLINE_S

#: the newest Azurite whose package accepts Debian 12's Node 18 (3.36 asks for Node >= 21, 3.37 for >= 22)
AZURITE_VERSION = "3.35.0"
ACCOUNT = "devstoreaccount1"
#: Azurite's published development key (public, in Microsoft's docs); a Secret all the same
ACCOUNT_KEY = Secret(
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
INSTALL_HINT = "as root: apt-get update && apt-get install -y nodejs npm"


def install_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where Azurite is (or will be) installed with npm."""
    return cache_home(env) / "asyncckpt" / f"azurite-{AZURITE_VERSION}"


def azurite_program() -> Path | None:
    """``azurite-blob`` from the cache directory, else from PATH; None when neither has it."""
    cached = install_dir() / "node_modules" / ".bin" / "azurite-blob"
    if cached.exists():
        return cached
    found = shutil.which("azurite-blob")
    return Path(found) if found else None


def ensure_azurite(install: bool = True) -> Path:
    """The ``azurite-blob`` program, installed with npm into :func:`install_dir` if missing."""
    if shutil.which("node") is None:
        raise EmulatorUnavailableError(f"Azurite needs Node.js, which is not installed; {INSTALL_HINT}")
    program = azurite_program()
    if program is not None:
        return program
    how = "python -m asyncckpt.servers.azurite install"
    if not install:
        raise EmulatorUnavailableError(f"Azurite is not installed; install it with: {how}")
    if shutil.which("npm") is None:
        raise EmulatorUnavailableError(f"Azurite is installed with npm, which is missing; {INSTALL_HINT}")
    target = install_dir()
    target.mkdir(parents=True, exist_ok=True)
    argv = ["npm", "install", "--prefix", str(target), "--no-audit", "--no-fund", "--loglevel=error"]
    try:
        done = subprocess.run(
            [*argv, f"azurite@{AZURITE_VERSION}"], capture_output=True, text=True, timeout=900
        )
    except subprocess.TimeoutExpired:
        raise EmulatorUnavailableError(f"npm install azurite@{AZURITE_VERSION} took over 900 s") from None
    if done.returncode != 0 or (program := azurite_program()) is None:
        raise EmulatorUnavailableError(
            f"npm install azurite@{AZURITE_VERSION} into {target} failed: {done.stderr.strip()[-600:]}"
        )
    return program


@dataclass(frozen=True)
class AzureEndpoint:
    """A running Azurite: the blob service URL, the account and its key (path-style URLs)."""

    blob_url: str
    account: str = ACCOUNT
    key: Secret = field(default=ACCOUNT_KEY, repr=False)

    @property
    def account_url(self) -> str:
        """``http://127.0.0.1:PORT/devstoreaccount1``: the endpoint obstore's AzureStore takes."""
        return f"{self.blob_url}/{self.account}"

    def sas(self) -> Secret:
        """An account SAS (read/write/delete/list) for clients that take no account key (s3dlio)."""
        return account_sas(self.account, self.key)

    def connection_string(self) -> Secret:
        """The Azure SDKs' connection string for this account (``BlobEndpoint`` path-style)."""
        return Secret(
            f"DefaultEndpointsProtocol=http;AccountName={self.account};"
            f"AccountKey={self.key.reveal()};BlobEndpoint={self.account_url};"
        )

    def env(self) -> dict[str, str]:
        """The variables Azure clients read: asyncckpt.env's names, plus s3dlio's own (SAS mode).

        Not ``AZURE_STORAGE_ENDPOINT``: obstore reads it as the account URL
        (``…/devstoreaccount1``), s3dlio as the host it appends the account to, and s3dlio
        prefers it to ``AZURE_BLOB_ENDPOINT_URL``; either meaning breaks the other client.
        """
        names = {key: AZURE_VARIABLES[key] for key in ("account", "account_key", "connection_string")}
        values = {
            "account": self.account,
            "account_key": self.key.reveal(),
            "connection_string": self.connection_string().reveal(),
        }
        out = {name: values[key] for key, group in names.items() for name in group}
        out.update(
            {
                "AZURE_BLOB_ENDPOINT_URL": self.blob_url,  # s3dlio: the host; URIs are az://ACCOUNT/container/key
                "S3DLIO_AZURE_CREDENTIAL": "sas",
                "S3DLIO_AZURE_SAS_TOKEN": self.sas().reveal(),
            }
        )
        return out

    def obstore_config(self) -> dict[str, Any]:
        """``AzureStore(container, config=..., client_options={"allow_http": True})`` keywords.

        Not ``use_emulator``: obstore then ignores ``endpoint`` and goes to port 10000.
        """
        return {"account_name": self.account, "account_key": self.key.reveal(), "endpoint": self.account_url}

    def request(self, method: str, path: str, **kwargs: Any) -> tuple[int, bytes]:
        """A SharedKey-signed request (``path``: ``/container[/blob]``)."""
        return shared_key_request(
            method, self.account_url, path, account=self.account, key=self.key, **kwargs
        )

    def ready(self) -> bool:
        """True when a signed List Containers succeeds (the service and its authentication are up)."""
        try:
            status, _ = self.request("GET", "", query={"comp": "list"}, timeout=2.0)
        except OSError:
            return False
        return status == 200

    def create_container(self, name: str | None = None, *, deadline_s: float = STARTUP_DEADLINE_S) -> str:
        """Create a container (a unique ``test-…`` name when none is given) and return its name."""
        name = name or f"test-{uuid.uuid4().hex[:16]}"
        deadline, delay = time.monotonic() + deadline_s, 0.05
        while True:
            try:
                status, body = self.request("PUT", f"/{name}", query={"restype": "container"}, timeout=30.0)
            except OSError as exc:
                status, body = 0, str(exc).encode()
            if status in (201, 409) and (status == 201 or b"ContainerAlreadyExists" in body):
                return name
            if status not in RETRY_STATUSES or time.monotonic() + delay > deadline:
                text = body.decode(errors="replace")[:300]
                raise StorageError(f"create container {name!r} at {self.blob_url}: HTTP {status}: {text}")
            time.sleep(delay)  # setup off any event loop
            delay = min(delay * 2, 1.0)


@dataclass
class AzuriteServer(ChildEmulator[AzureEndpoint]):
    """Azurite's blob service on 127.0.0.1; ``with``/``async with`` yield an :class:`AzureEndpoint`.

    ``in_memory`` keeps blobs in Azurite's memory (else in the temporary directory); ``loose``
    ignores headers Azurite does not implement instead of refusing them.
    """

    in_memory: bool = True
    loose: bool = True
    install: bool = True

    def start(self, timeout: float = 60.0) -> AzureEndpoint:
        program = ensure_azurite(self.install)

        def launch(child: ChildServer, port: int) -> AzureEndpoint:
            argv = [str(program), "--blobHost", "127.0.0.1", "--blobPort", str(port)]
            argv += ["--inMemoryPersistence"] if self.in_memory else ["--location", str(child.root)]
            argv += ["--skipApiVersionCheck", "--disableTelemetry", "--silent"] + ["--loose"] * self.loose
            child.marker = f"--blobPort {port}"  # in memory, no directory is on the command line
            self.child = child
            child.spawn(argv, env=child_environ())
            ep = AzureEndpoint(f"http://127.0.0.1:{port}")
            child.wait_ready(ep.ready, timeout)
            return ep

        return self.run("azurite", launch)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m asyncckpt.servers.azurite install``: npm-install Azurite into the cache."""
    parser = argparse.ArgumentParser(prog="python -m asyncckpt.servers.azurite", description=__doc__)
    parser.add_argument("command", choices=("install",))
    parser.parse_args(argv)
    try:
        print(f"azurite-blob: {ensure_azurite(install=True)}")
    except AsyncCkptError as exc:
        print(f"asyncckpt.servers.azurite: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
