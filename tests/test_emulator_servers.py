"""The Azurite and fake-gcs-server wrappers: start, readiness, settings, clean stop, refusals."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from asyncckpt.env import AZURE_VARIABLES, GCS_VARIABLES, azure_variable, gcs_variable
from asyncckpt.servers import azurite, gcs_emulator
from asyncckpt.servers.azurite import ACCOUNT_KEY, AzureEndpoint, AzuriteServer
from asyncckpt.servers.embedded_swift import group_members
from asyncckpt.servers.emulator_process import EmulatorUnavailableError
from asyncckpt.servers.gcs_emulator import GcsEmulator, GcsEndpoint
from tests.ports import nothing_of_ours_listens, refused

REPO = Path(__file__).resolve().parents[1]


def wait_gone(pid: int, deadline_s: float = 20.0) -> bool:
    deadline = time.monotonic() + deadline_s
    while group_members(pid) and time.monotonic() < deadline:
        time.sleep(0.05)  # polling the condition, with a deadline
    return not group_members(pid)


def test_azurite_start_stop_leaves_nothing(azurite_endpoint: AzureEndpoint) -> None:
    server = AzuriteServer()
    ep = server.start()
    pid = server.pid
    assert pid is not None and group_members(pid)
    assert ep.ready() and ep.blob_url != azurite_endpoint.blob_url
    assert ACCOUNT_KEY.reveal() not in repr(ep) + repr(server)
    server.stop()
    assert not group_members(pid) and refused(ep.blob_url)
    server.stop()  # idempotent
    assert azurite_endpoint.ready()  # the session's server was not touched


def test_gcs_emulator_on_disk_removes_its_directory(gcs_endpoint: GcsEndpoint) -> None:
    server = GcsEmulator(in_memory=False)
    ep = server.start()
    assert server.child is not None and server.pid is not None
    root, pid = server.child.root, server.pid
    bucket = ep.create_bucket()
    status, _ = ep.request("POST", f"/upload/storage/v1/b/{bucket}/o?uploadType=media&name=a", b"abc")
    assert status == 200 and any((root / "data").rglob("*"))  # the objects are in our directory
    server.stop()
    assert not root.exists() and not group_members(pid) and refused(ep.url)
    assert gcs_endpoint.ready()


async def test_async_with_starts_and_stops_off_the_loop() -> None:
    server = GcsEmulator()
    async with server as ep:
        pid = server.pid
        assert pid is not None and ep.ready()
    assert not group_members(pid) and refused(ep.url)


@pytest.mark.parametrize("kind", ["azurite", "gcs"])
def test_servers_die_with_a_killed_owner(kind: str, request: pytest.FixtureRequest) -> None:
    """A test run killed with SIGKILL (no teardown) must not leave an emulator running."""
    request.getfixturevalue("azurite_endpoint" if kind == "azurite" else "gcs_endpoint")  # skips if absent
    make = "AzuriteServer(install=False)" if kind == "azurite" else "GcsEmulator()"
    code = (
        "import json, sys\n"
        "from asyncckpt.servers.azurite import AzuriteServer\n"
        "from asyncckpt.servers.gcs_emulator import GcsEmulator\n"
        f"s = {make}; ep = s.start()\n"
        "print(json.dumps({'pid': s.pid, 'root': str(s.child.root), 'url': getattr(ep, 'blob_url', None) "
        "or ep.url}), flush=True)\n"
        "sys.stdin.read()\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    owner = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert owner.stdout is not None
        info = json.loads(owner.stdout.readline())
        assert not refused(info["url"])
    finally:
        owner.kill()
        owner.wait()
    assert wait_gone(info["pid"])
    # the freed port may be bound again by anyone at once; only a listener of ours fails
    gone, who = nothing_of_ours_listens(info["url"], (info["root"], "azurite", "fake-gcs-server"))
    assert gone, f"still listening on {info['url']}: {who}"
    shutil.rmtree(info["root"], ignore_errors=True)  # the owner could not clean up its directory


def test_settings_use_the_names_asyncckpt_env_reads(
    azurite_endpoint: AzureEndpoint, gcs_endpoint: GcsEndpoint
) -> None:
    az, gs = azurite_endpoint.env(), gcs_endpoint.env()
    assert azure_variable("account", az) == (AZURE_VARIABLES["account"][0], "devstoreaccount1")
    assert azure_variable("endpoint", az) is None  # two clients, two meanings: see test_store_emulators
    assert f"BlobEndpoint={azurite_endpoint.account_url};" in azure_variable("connection_string", az)[1]
    assert azure_variable("account_key", az) == ("AZURE_STORAGE_ACCOUNT_KEY", ACCOUNT_KEY.reveal())
    assert az["AZURE_STORAGE_KEY"] == ACCOUNT_KEY.reveal()  # the Azure CLI's name too
    assert gcs_variable("emulator_host", gs) == (GCS_VARIABLES["emulator_host"][0], gcs_endpoint.url)
    assert json.loads(gs["GOOGLE_SERVICE_ACCOUNT_KEY"])["disable_oauth"] is True
    assert "**********" in repr(azurite_endpoint.sas()) and "sig=" in azurite_endpoint.sas().reveal()


def test_no_node_is_refused_with_how_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # a PATH without node: what a machine without Node.js has
    with pytest.raises(EmulatorUnavailableError, match=r"Node\.js.*apt-get install -y nodejs npm"):
        AzuriteServer().start()


def test_no_azurite_and_no_install_says_how(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    if azurite.shutil.which("node") is None:
        pytest.skip("needs Node.js")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # an empty cache: Azurite is not installed there
    if azurite.shutil.which("azurite-blob"):
        pytest.skip("azurite-blob is installed globally on PATH")
    with pytest.raises(EmulatorUnavailableError, match=r"python -m asyncckpt\.servers\.azurite install"):
        AzuriteServer(install=False).start()


def test_no_gcs_wheel_is_refused_with_how_to_install(tmp_path: Path) -> None:
    """In an interpreter whose path lacks the wheel (a venv without the test extra)."""
    code = (
        "import sys\n"
        "from asyncckpt.servers.gcs_emulator import fake_gcs_program\n"
        "from asyncckpt.servers.emulator_process import EmulatorUnavailableError\n"
        "sys.path = [p for p in sys.path if 'site-packages' not in p]  # after asyncckpt's own imports\n"
        "try:\n    fake_gcs_program()\nexcept EmulatorUnavailableError as e:\n    print(e)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert f"pip install {gcs_emulator.WHEEL}" in done.stdout, done.stderr[-2000:]
