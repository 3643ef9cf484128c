"""The embedded Swift: launcher hygiene, CLI, its documented differences from AWS, full disk."""

from __future__ import annotations

import base64
import json
import shutil
import socket
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from asyncckpt.servers import embedded_swift
from asyncckpt.servers.embedded import MOTO_SECRET_KEY
from asyncckpt.servers.embedded_swift import SECRET_KEY, SwiftServer, SwiftUnavailableError, group_members
from asyncckpt.servers.s3compat import QUIRKS
from asyncckpt.servers.s3endpoint import S3Endpoint
from tests.plugins import s3servers
from tests.plugins.s3servers import boto3_client
from tests.ports import refused

MiB = 1 << 20


def assert_gone(pids: dict[str, int], root: Path, endpoint: str) -> None:
    assert all(not group_members(pid) for pid in pids.values()), pids
    assert not root.exists()
    assert refused(endpoint)


def test_start_stop_leaves_nothing(swift_endpoint: S3Endpoint) -> None:
    server = SwiftServer()
    ep = server.start()
    pids, root = dict(server.pids), server.root
    assert root is not None and set(pids) == {"memcached", "account", "container", "object", "proxy"}
    assert ep.ready() and ep.endpoint != swift_endpoint.endpoint
    assert SECRET_KEY not in repr(ep) and SECRET_KEY not in repr(server)
    server.stop()
    assert_gone(pids, root, ep.endpoint)
    server.stop()  # idempotent
    assert swift_endpoint.ready()  # the session's server was not touched


def test_servers_die_with_a_killed_owner(swift_endpoint: S3Endpoint, tmp_path: Path) -> None:
    """A test run killed with SIGKILL (no teardown) must not leave Swift running."""
    code = (
        "import json, sys, time\n"
        "from asyncckpt.servers.embedded_swift import SwiftServer\n"
        "s = SwiftServer(install=False); ep = s.start()\n"
        "print(json.dumps({'pids': s.pids, 'root': str(s.root), 'endpoint': ep.endpoint}), flush=True)\n"
        "time.sleep(600)\n"
    )
    owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout is not None
        info = json.loads(owner.stdout.readline())
        assert S3Endpoint("swift", info["endpoint"], "test:tester", SECRET_KEY).ready()
    finally:
        owner.kill()
        owner.wait()
    deadline = time.monotonic() + 20
    while any(group_members(pid) for pid in info["pids"].values()) and time.monotonic() < deadline:
        time.sleep(0.05)  # polling the condition, with a deadline
    assert not any(group_members(pid) for pid in info["pids"].values())
    assert refused(info["endpoint"])
    shutil.rmtree(info["root"])  # the owner could not clean up its directory; the servers are gone


def test_start_retries_when_a_chosen_port_is_taken(
    swift_endpoint: S3Endpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ports are picked before the servers bind them; losing that race must not fail a start."""
    real, picks = embedded_swift.free_ports, []
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()

        def racy(n: int) -> list[int]:
            ports = real(n)
            if not picks:
                ports[-1] = busy.getsockname()[1]  # the proxy's port is taken
            picks.append(ports)
            return ports

        monkeypatch.setattr(embedded_swift, "free_ports", racy)
        with SwiftServer() as ep:
            assert ep.ready() and len(picks) == 2


def test_cli_start_is_idempotent_and_stop_cleans_up(swift_endpoint: S3Endpoint, tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    cli = [sys.executable, "-m", "asyncckpt.servers.swift", "--state", str(state), "--no-install"]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*cli, *args], capture_output=True, text=True, timeout=60)

    first = run("start", "--bucket", "demo-bucket")
    assert first.returncode == 0, first.stderr
    env = dict(line.split("=", 1) for line in first.stdout.splitlines())
    assert env["AWS_ACCESS_KEY_ID"] == "test:tester" and env["AWS_REGION"] == "us-east-1"
    ep = S3Endpoint("swift", env["AWS_ENDPOINT_URL"], env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"])
    assert ep.request("HEAD", "/demo-bucket")[0] == 200
    info = json.loads(state.read_text())
    again = run("start", "--export")
    assert again.returncode == 0 and f"export AWS_ENDPOINT_URL={ep.endpoint}" in again.stdout
    assert run("status").returncode == 0
    assert run("stop").returncode == 0
    assert_gone(info["pids"], Path(info["root"]), ep.endpoint)
    assert not state.exists()
    assert run("status").returncode == 3
    assert run("stop").returncode == 0  # idempotent


def test_cli_run_passes_the_environment(swift_endpoint: S3Endpoint, tmp_path: Path) -> None:
    code = "import os; print(os.environ['AWS_ENDPOINT_URL'])"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "asyncckpt.servers.swift",
            "run",
            "--no-install",
            "--",
            sys.executable,
            "-c",
            code,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert refused(done.stdout.strip())  # stopped after the command


# --- how Swift differs from AWS (documented in asyncckpt.servers.s3compat.QUIRKS) ---


def test_quirks_are_documented(swift_endpoint: S3Endpoint) -> None:
    assert swift_endpoint.quirks <= set(QUIRKS)


def test_delete_objects_needs_content_md5(swift_endpoint: S3Endpoint) -> None:
    bucket = swift_endpoint.create_bucket()
    plain = boto3.client(
        "s3", config=Config(s3={"addressing_style": "path"}), **swift_endpoint.client_kwargs()
    )
    plain.put_object(Bucket=bucket, Key="a", Body=b"x")
    with pytest.raises(ClientError, match="Content-MD5"):
        plain.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "a"}]})
    out = boto3_client(swift_endpoint).delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "a"}]})
    assert [d["Key"] for d in out["Deleted"]] == ["a"]


@pytest.mark.parametrize("method", ["get_object", "head_object"])
def test_part_number_get_is_refused(swift_endpoint: S3Endpoint, method: str) -> None:
    client, bucket = boto3_client(swift_endpoint), swift_endpoint.create_bucket()
    upload_id = client.create_multipart_upload(Bucket=bucket, Key="k")["UploadId"]
    etag = client.upload_part(Bucket=bucket, Key="k", UploadId=upload_id, PartNumber=1, Body=b"p" * MiB)[
        "ETag"
    ]
    client.complete_multipart_upload(
        Bucket=bucket,
        Key="k",
        UploadId=upload_id,
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etag}]},
    )
    with pytest.raises(ClientError) as err:
        getattr(client, method)(Bucket=bucket, Key="k", PartNumber=1)
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 405
    assert client.get_object(Bucket=bucket, Key="k", Range="bytes=0-9")["Body"].read() == b"p" * 10


def test_checksum_headers_are_ignored(swift_endpoint: S3Endpoint) -> None:
    client, bucket = boto3_client(swift_endpoint), swift_endpoint.create_bucket()
    wrong = base64.b64encode(b"\0" * 32).decode()
    client.put_object(Bucket=bucket, Key="k", Body=b"hello", ChecksumSHA256=wrong)  # AWS: BadDigest
    assert client.get_object(Bucket=bucket, Key="k")["Body"].read() == b"hello"
    with pytest.raises(ClientError, match="BadDigest"):  # Content-MD5 *is* verified
        client.put_object(
            Bucket=bucket, Key="k2", Body=b"hello", ContentMD5=base64.b64encode(b"\0" * 16).decode()
        )


def test_aws_chunked_body_is_refused(swift_endpoint: S3Endpoint) -> None:
    bucket = swift_endpoint.create_bucket()
    crc = base64.b64encode(zlib.crc32(b"hello").to_bytes(4, "big")).decode()
    body = f"5\r\nhello\r\n0\r\nx-amz-checksum-crc32:{crc}\r\n\r\n".encode()
    headers = {
        "x-amz-content-sha256": "STREAMING-UNSIGNED-PAYLOAD-TRAILER",
        "content-encoding": "aws-chunked",
        "x-amz-decoded-content-length": "5",
        "x-amz-trailer": "x-amz-checksum-crc32",
    }
    status, text = swift_endpoint.request("PUT", f"/{bucket}/k", body, headers=headers)
    assert status == 501 and b"aws-chunked" in text
    assert swift_endpoint.request("HEAD", f"/{bucket}/k")[0] == 404
    assert swift_endpoint.request("PUT", f"/{bucket}/k", b"hello")[0] == 200  # a plain body works


# --- full disk: the data dir on a 16 MiB tmpfs ---


def test_full_disk_fails_clearly_and_leaves_no_object(swift_small_disk: S3Endpoint) -> None:
    client, bucket = boto3_client(swift_small_disk), swift_small_disk.create_bucket()
    with pytest.raises(ClientError) as err:
        client.put_object(Bucket=bucket, Key="big", Body=b"x" * (20 * MiB))
    assert_full(err.value)
    upload_id = client.create_multipart_upload(Bucket=bucket, Key="mpu")["UploadId"]
    with pytest.raises(ClientError) as err:
        for n in range(1, 6):  # 25 MiB into 16 MiB
            client.upload_part(
                Bucket=bucket, Key="mpu", UploadId=upload_id, PartNumber=n, Body=b"y" * (5 * MiB)
            )
    assert_full(err.value)
    client.abort_multipart_upload(Bucket=bucket, Key="mpu", UploadId=upload_id)
    assert client.list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0
    assert client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    client.put_object(Bucket=bucket, Key="small", Body=b"z" * MiB)  # space came back after the abort


def assert_full(exc: ClientError) -> None:
    response: Any = exc.response
    assert response["ResponseMetadata"]["HTTPStatusCode"] == 503
    assert response["Error"]["Code"] == "ServiceUnavailable"
    assert "reduce your request rate" in response["Error"]["Message"]


# --- the plugin's skip/fail policy when Swift cannot be installed ---


class _Unavailable:
    def __enter__(self) -> None:
        raise SwiftUnavailableError("Swift packages missing (swift-proxy) and cannot install them here")

    def __exit__(self, *exc: object) -> None:
        raise AssertionError("never entered")


@pytest.mark.parametrize(
    ("choice", "outcome"), [("both", pytest.skip.Exception), ("swift", pytest.fail.Exception)]
)
def test_unavailable_swift_is_skipped_with_reason_or_fails_when_asked(
    pytestconfig: pytest.Config, monkeypatch: pytest.MonkeyPatch, choice: str, outcome: type[BaseException]
) -> None:
    monkeypatch.setattr(s3servers, "SwiftServer", _Unavailable)
    monkeypatch.setattr(pytestconfig.option, "s3_server", choice)
    servers = s3servers.Servers(pytestconfig)
    for _ in range(2):  # remembered: the second use does not retry
        with pytest.raises(outcome, match="cannot install them here"):
            servers.get("swift")


# --- the bench CLI starts and stops an embedded server ---


@pytest.mark.parametrize("kind", ["moto", "swift"])
def test_bench_embedded_s3_starts_server_and_bucket_then_stops(
    request: pytest.FixtureRequest, kind: str
) -> None:
    if kind == "swift":
        request.getfixturevalue("swift_endpoint")  # skip with the reason when Swift is unavailable
    done = subprocess.run(
        [sys.executable, "-m", "asyncckpt.bench", "--embedded-s3", kind, "--size", "8MiB", "-q"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [x for x in done.stderr.splitlines() if f"embedded {kind} S3 server at" in x]
    assert lines, (
        f"no 'embedded {kind} S3 server at' line; rc={done.returncode}; stderr:\n{done.stderr[-3000:]}"
    )
    endpoint = lines[0].split(" at ")[1].split(",")[0]
    assert "bucket asyncckpt-bench" in lines[0]
    assert refused(endpoint)  # stopped at exit, whatever the run's outcome
    assert done.returncode == 0, done.stderr[-3000:]
    ops = [row.split()[1] for row in done.stdout.splitlines() if row[:1].isdigit()]
    assert ops == ["save", "load"], done.stdout  # the default mode saves, then loads and verifies
    for secret in (SECRET_KEY, MOTO_SECRET_KEY):
        assert secret not in done.stdout + done.stderr
