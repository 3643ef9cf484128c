"""Which client works with which emulator: obstore and s3dlio used directly against Azurite and
fake-gcs-server. Each finding of docs/azure-gcs.md ("Emulators and clients") is an assertion here.

s3dlio reads its Azure settings from the environment once per process, so its cases run in a
child interpreter with exactly the variables under test.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import http.client
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import crc32c
import obstore
import pytest
from obstore.exceptions import GenericError, PermissionDeniedError
from obstore.store import AzureStore, GCSStore

from asyncckpt.servers.azurite import AzureEndpoint
from asyncckpt.servers.gcs_emulator import GcsEndpoint

MiB = 1 << 20
NO_RETRY = {"max_retries": 0, "retry_timeout": datetime.timedelta(seconds=2)}
HTTP = {"allow_http": True}
REPO = Path(__file__).resolve().parents[1]


def az_store(ep: AzureEndpoint, container: str, **config: Any) -> AzureStore:
    return AzureStore(
        container, config={**ep.obstore_config(), **config}, client_options=HTTP, retry_config=NO_RETRY
    )


def gcs_store(ep: GcsEndpoint, bucket: str, base_url: str | None = None) -> GCSStore:
    key = ep.service_account_key()
    if base_url is not None:
        key = json.dumps({**json.loads(key), "gcs_base_url": base_url})
    return GCSStore(bucket, config={"service_account_key": key}, client_options=HTTP, retry_config=NO_RETRY)


def run_s3dlio(env: dict[str, str], code: str, timeout: float = 60.0) -> Any:
    """Run ``code`` (which sets ``out``) in a child with ``env``; return ``out`` (JSON)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("AZURE_", "S3DLIO_", "STORAGE_EMU"))}
    script = f"import json, s3dlio\nout = None\n{code}\nprint(json.dumps(out))\n"
    done = subprocess.run(
        [sys.executable, "-c", script], env={**clean, **env}, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


CATCH = """def err(f):
    try:
        f()
        return 'ok'
    except Exception as e:
        return f'{type(e).__name__}: {e}'
"""


# ---------------------------------------------------------------- Azure Blob (Azurite) + obstore


def test_azure_obstore_basic_operations(azurite_endpoint: AzureEndpoint, az_container: str) -> None:
    store = az_store(azurite_endpoint, az_container)
    obstore.put(store, "p/a.bin", bytes(range(100)))
    obstore.put(store, "q/b.bin", b"other")
    assert bytes(obstore.get_range(store, "p/a.bin", start=10, end=15)) == bytes(range(10, 15))
    assert obstore.head(store, "p/a.bin")["size"] == 100
    assert [m["path"] for m in obstore.list(store, prefix="p").collect()] == ["p/a.bin"]
    obstore.delete(store, "p/a.bin")
    with pytest.raises(FileNotFoundError):
        obstore.head(store, "p/a.bin")


def test_azure_obstore_writer_is_blocks_then_one_block_list(
    azurite_endpoint: AzureEndpoint, az_container: str
) -> None:
    """open_writer = Put Block per buffer, Put Block List at close: nothing visible before."""
    store = az_store(azurite_endpoint, az_container)
    writer = obstore.open_writer(store, "mp/obj", buffer_size=5 * MiB)
    writer.write(b"a" * (12 * MiB))
    writer.flush()
    with pytest.raises(FileNotFoundError):
        obstore.head(store, "mp/obj")
    assert obstore.list(store, prefix="mp").collect() == []
    writer.close()
    assert obstore.head(store, "mp/obj")["size"] == 12 * MiB
    _, body = azurite_endpoint.request(
        "GET", f"/{az_container}/mp/obj", query={"comp": "blocklist", "blocklisttype": "all"}
    )
    assert body.count(b"<Block>") == 3 and b"<UncommittedBlocks/>" in body  # 5 + 5 + 2 MiB


def test_azure_obstore_failed_multipart_put_leaves_nothing(
    azurite_endpoint: AzureEndpoint, az_container: str
) -> None:
    store = az_store(azurite_endpoint, az_container)

    def source() -> Any:
        yield b"b" * (6 * MiB)
        raise RuntimeError("the source failed")

    with pytest.raises(RuntimeError, match="the source failed"):
        obstore.put(store, "mp/fail", source(), use_multipart=True, chunk_size=5 * MiB)
    with pytest.raises(FileNotFoundError):
        obstore.head(store, "mp/fail")


def test_azure_obstore_error_shapes(azurite_endpoint: AzureEndpoint, az_container: str) -> None:
    store = az_store(azurite_endpoint, az_container)
    with pytest.raises(FileNotFoundError, match="BlobNotFound"):
        obstore.get(store, "no-such-key")
    with pytest.raises(FileNotFoundError, match="ContainerNotFound"):  # same class as a missing key
        obstore.put(az_store(azurite_endpoint, "no-such-container"), "k", b"1")
    wrong = base64.b64encode(b"not the key" * 4).decode()
    with pytest.raises(PermissionDeniedError, match="403"):
        obstore.put(az_store(azurite_endpoint, az_container, account_key=wrong), "k", b"1")
    with pytest.raises(GenericError, match="error sending request"):
        obstore.put(az_store(azurite_endpoint, az_container, endpoint="http://127.0.0.1:9/x"), "k", b"1")


def test_azure_integrity_is_md5_per_request(azurite_endpoint: AzureEndpoint, az_container: str) -> None:
    """Put Block verifies Content-MD5; Azurite 3.35 ignores x-ms-content-crc64 (3.37, which
    needs Node >= 22, refuses a wrong one with Crc64Mismatch, as Azure does); no CRC32C header
    exists. obstore sends neither."""
    path, block = f"/{az_container}/sum", {"comp": "block", "blockid": base64.b64encode(b"block-01").decode()}
    md5 = base64.b64encode(hashlib.md5(b"hello").digest()).decode()
    ok, _ = azurite_endpoint.request("PUT", path, query=block, body=b"hello", headers={"Content-MD5": md5})
    assert ok == 201
    status, body = azurite_endpoint.request(
        "PUT", path, query=block, body=b"hellO", headers={"Content-MD5": md5}
    )
    assert status == 400 and b"contentMD5 doesn't match" in body  # Azure says Md5Mismatch
    bad_crc64 = base64.b64encode(bytes(8)).decode()
    status, _ = azurite_endpoint.request(
        "PUT", path, query=block, body=b"hello", headers={"x-ms-content-crc64": bad_crc64}
    )
    assert status == 201  # not verified by this emulator: a CRC64 path cannot be tested on it
    assert azurite_endpoint.request("HEAD", path)[0] == 404  # a block alone is never a blob


def test_azure_endpoint_variable_means_two_things(azurite_endpoint: AzureEndpoint, az_container: str) -> None:
    """obstore's endpoint is the account URL, s3dlio's AZURE_STORAGE_ENDPOINT the host."""
    with pytest.raises(GenericError, match="OutOfRangeInput"):  # the container is taken for the account
        obstore.put(az_store(azurite_endpoint, az_container, endpoint=azurite_endpoint.blob_url), "k", b"1")
    env = {**azurite_endpoint.env(), "AZURE_STORAGE_ENDPOINT": azurite_endpoint.account_url}
    uri = f"az://{azurite_endpoint.account}/{az_container}/k"
    out = run_s3dlio(env, f"{CATCH}out = err(lambda: s3dlio.put_bytes({uri!r}, b'1'))")
    assert "ContainerNotFound" in out  # s3dlio prefers it to AZURE_BLOB_ENDPOINT_URL and appends the account


# ---------------------------------------------------------------- Azure Blob (Azurite) + s3dlio


def test_azure_s3dlio_operations_with_a_sas(azurite_endpoint: AzureEndpoint, az_container: str) -> None:
    base = f"az://{azurite_endpoint.account}/{az_container}/"
    code = f"""{CATCH}
B = {base!r}
s3dlio.put_bytes(B + 'p/a.bin', bytes(range(100)))
s3dlio.put_bytes(B + 'q/b.bin', b'other')
out = {{
    'range': list(bytes(s3dlio.get_range(B + 'p/a.bin', 10, 5))),
    'size': s3dlio.stat(B + 'p/a.bin')['size'],
    'list': s3dlio.list(B + 'p/'),
    'delete_missing': err(lambda: s3dlio.delete(B + 'p/none')),
}}
s3dlio.delete(B + 'p/a.bin')
out['after_delete'] = err(lambda: s3dlio.stat(B + 'p/a.bin'))
out['missing_key'] = err(lambda: s3dlio.get(B + 'p/none'))
N = 'az://{azurite_endpoint.account}/no-such-container/k'
out['missing_container'] = err(lambda: s3dlio.put_bytes(N, b'1'))
"""
    out = run_s3dlio(azurite_endpoint.env(), code)
    assert out["range"] == list(range(10, 15)) and out["size"] == 100
    assert out["list"] == [base + "p/a.bin"] and out["delete_missing"] == "ok"
    assert out["after_delete"].startswith("RuntimeError: 404")
    assert out["missing_key"].startswith("RuntimeError") and "BlobNotFound" in out["missing_key"]
    assert "ContainerNotFound" in out["missing_container"]


def test_azure_s3dlio_streaming_writer(azurite_endpoint: AzureEndpoint, az_container: str) -> None:
    """create_azure_writer: 4 MiB blocks, one block list at finalize; a dropped writer leaves nothing.
    MultipartUploadWriter is S3 only."""
    base = f"az://{azurite_endpoint.account}/{az_container}/"
    code = f"""{CATCH}
B = {base!r}
w = s3dlio.create_azure_writer(B + 'w')
w.write_chunk(b'd' * (12 << 20))
out = {{'before': err(lambda: s3dlio.stat(B + 'w'))}}
out['finalize'] = list(w.finalize())
out['after'] = s3dlio.stat(B + 'w')['size']
d = s3dlio.create_azure_writer(B + 'dropped')
d.write_chunk(b'e' * (12 << 20))
del d
out['dropped'] = err(lambda: s3dlio.stat(B + 'dropped'))
out['mpu'] = err(lambda: s3dlio.MultipartUploadWriter.from_uri(B + 'm', part_size=5 << 20))
"""
    out = run_s3dlio(azurite_endpoint.env(), code)
    assert out["before"].startswith("RuntimeError: 404") and out["dropped"].startswith("RuntimeError: 404")
    assert out["finalize"] == [12 * MiB, 12 * MiB] and out["after"] == 12 * MiB
    assert "URI must start with s3://" in out["mpu"]
    _, body = azurite_endpoint.request("GET", f"/{az_container}/w", query={"comp": "blocklist"})
    assert body.count(b"<Size>4194304</Size>") == 3


def test_azure_s3dlio_needs_sas_mode_and_a_valid_sas(
    azurite_endpoint: AzureEndpoint, az_container: str
) -> None:
    uri = f"az://{azurite_endpoint.account}/{az_container}/k"
    code = f"{CATCH}out = err(lambda: s3dlio.put_bytes({uri!r}, b'1'))"
    no_mode = {k: v for k, v in azurite_endpoint.env().items() if k != "S3DLIO_AZURE_CREDENTIAL"}
    assert "credential mode none" in run_s3dlio(no_mode, code)  # no account key mode at all
    forged = azurite_endpoint.sas().reveal().rsplit("sig=", 1)[0] + "sig=AAAA"
    out = run_s3dlio({**azurite_endpoint.env(), "S3DLIO_AZURE_SAS_TOKEN": forged}, code)
    assert "credential mode sas" in out and "403" in out and "AuthorizationFailure" in out


def test_azure_s3dlio_keeps_retrying_a_closed_port(azurite_endpoint: AzureEndpoint) -> None:
    """No fast failure: measured 85 s of retries before the error (the sink needs its watchdog)."""
    env = {**azurite_endpoint.env(), "AZURE_BLOB_ENDPOINT_URL": "http://127.0.0.1:9"}
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("AZURE_", "S3DLIO_"))}
    code = f"import s3dlio; s3dlio.put_bytes('az://{azurite_endpoint.account}/c/k', b'1')"
    child = subprocess.Popen([sys.executable, "-c", code], env={**clean, **env}, stderr=subprocess.DEVNULL)
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            child.wait(timeout=4)  # import ≈ 1 s; a fast failure would have ended it
    finally:
        child.kill()
        child.wait()


# ---------------------------------------------------------------- GCS (fake-gcs-server)


def json_upload(ep: GcsEndpoint, bucket: str, name: str, data: bytes, **meta: str) -> dict[str, Any]:
    """A JSON-API multipart upload (metadata + media), the way Google's clients upload."""
    boundary = "asyncckpt-boundary"
    meta_json = json.dumps({"name": name, **meta}).encode()
    body = b"".join(
        [
            f"--{boundary}\r\nContent-Type: application/json\r\n\r\n".encode(),
            meta_json,
            f"\r\n--{boundary}\r\nContent-Type: application/octet-stream\r\n\r\n".encode(),
            data,
            f"\r\n--{boundary}--\r\n".encode(),
        ]
    )
    headers = {"Content-Type": f"multipart/related; boundary={boundary}"}
    status, text = ep.request("POST", f"/upload/storage/v1/b/{bucket}/o?uploadType=multipart", body, headers)
    assert status == 200, text[:300]
    result: dict[str, Any] = json.loads(text)
    return result


def object_status(ep: GcsEndpoint, bucket: str, name: str) -> int:
    return ep.request("GET", f"/storage/v1/b/{bucket}/o/{quote(name, safe='')}")[0]


def test_gcs_obstore_reads_list_and_deletes(gcs_endpoint: GcsEndpoint, gcs_bucket: str) -> None:
    json_upload(gcs_endpoint, gcs_bucket, "p/a.bin", bytes(range(100)))
    json_upload(gcs_endpoint, gcs_bucket, "q/b.bin", b"other")
    store = gcs_store(gcs_endpoint, gcs_bucket)
    assert bytes(obstore.get_range(store, "p/a.bin", start=10, end=15)) == bytes(range(10, 15))
    assert obstore.head(store, "p/a.bin")["size"] == 100
    assert [m["path"] for m in obstore.list(store, prefix="p").collect()] == ["p/a.bin"]
    obstore.delete(store, "p/a.bin")
    assert object_status(gcs_endpoint, gcs_bucket, "p/a.bin") == 404


def test_gcs_obstore_cannot_write_to_fake_gcs_server(gcs_endpoint: GcsEndpoint, gcs_bucket: str) -> None:
    """obstore writes through GCS's XML API; fake-gcs-server implements only the JSON upload API."""
    store = gcs_store(gcs_endpoint, gcs_bucket)
    with pytest.raises(GenericError, match="invalid uploadType"):
        obstore.put(store, "k", b"1")
    with pytest.raises(GenericError, match="invalid uploadType"):  # POST ?uploads (XML multipart)
        obstore.put(store, "big", b"z" * (6 * MiB), use_multipart=True, chunk_size=5 * MiB)


def test_gcs_obstore_error_shapes(gcs_endpoint: GcsEndpoint, gcs_bucket: str) -> None:
    with pytest.raises(FileNotFoundError):
        obstore.get(gcs_store(gcs_endpoint, gcs_bucket), "no-such-key")
    missing = gcs_store(gcs_endpoint, "no-such-bucket")
    with pytest.raises(FileNotFoundError):  # a missing bucket looks like a missing key on GET
        obstore.get(missing, "k")
    with pytest.raises(GenericError, match="500"):  # ... and like a server error on LIST
        obstore.list(missing).collect()
    with pytest.raises(GenericError, match="error sending request"):
        obstore.get(gcs_store(gcs_endpoint, gcs_bucket, base_url="http://127.0.0.1:9"), "k")
    status, _ = gcs_endpoint.request(  # fake-gcs-server checks no credential at all
        "POST",
        f"/upload/storage/v1/b/{gcs_bucket}/o?uploadType=media&name=k",
        b"1",
        {"Authorization": "Bearer x"},
    )
    assert status == 200
    assert (
        gcs_endpoint.request("POST", "/upload/storage/v1/b/no-such-bucket/o?uploadType=media&name=k", b"1")[0]
        == 404
    )


def test_gcs_s3dlio_wheel_has_no_gcs_backend(gcs_endpoint: GcsEndpoint, gcs_bucket: str) -> None:
    out = run_s3dlio(
        gcs_endpoint.env(), f"{CATCH}out = err(lambda: s3dlio.put_bytes('gs://{gcs_bucket}/k', b'1'))"
    )
    assert "GCS backend is not enabled in this build" in out


def start_resumable(ep: GcsEndpoint, bucket: str, name: str) -> str:
    """Open a JSON-API resumable upload session; its URL comes back in ``Location``."""
    url = urlsplit(ep.url)
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=10)
    try:
        conn.request(
            "POST",
            f"/upload/storage/v1/b/{bucket}/o?uploadType=resumable&name={quote(name, safe='')}",
            body=json.dumps({"name": name}),
            headers={"Content-Type": "application/json"},
        )
        response = conn.getresponse()
        response.read()
        location = response.getheader("Location")
    finally:
        conn.close()
    assert location is not None
    parts = urlsplit(location)
    return f"{parts.path}?{parts.query}"


def test_gcs_json_resumable_upload_visible_only_when_final(
    gcs_endpoint: GcsEndpoint, gcs_bucket: str
) -> None:
    chunk = b"q" * (8 * MiB)
    session = start_resumable(gcs_endpoint, gcs_bucket, "r/obj")
    status, _ = gcs_endpoint.request("PUT", session, chunk, {"Content-Range": f"bytes 0-{len(chunk) - 1}/*"})
    assert status == 308  # resume incomplete
    assert object_status(gcs_endpoint, gcs_bucket, "r/obj") == 404
    last = {"Content-Range": f"bytes {len(chunk)}-{2 * len(chunk) - 1}/{2 * len(chunk)}"}
    status, text = gcs_endpoint.request("PUT", session, chunk, last)
    assert status == 200 and json.loads(text)["size"] == str(2 * len(chunk))
    crc = base64.b64encode(crc32c.crc32c(chunk + chunk).to_bytes(4, "big")).decode()
    assert json.loads(text)["crc32c"] == crc  # the server's CRC32C of the whole object, to compare


def test_gcs_json_resumable_cancel_leaves_nothing(gcs_endpoint: GcsEndpoint, gcs_bucket: str) -> None:
    session = start_resumable(gcs_endpoint, gcs_bucket, "c/obj")
    gcs_endpoint.request("PUT", session, b"x" * MiB, {"Content-Range": f"bytes 0-{MiB - 1}/*"})
    assert gcs_endpoint.request("DELETE", session)[0] == 499  # GCS's answer to a cancelled session
    assert object_status(gcs_endpoint, gcs_bucket, "c/obj") == 404


def test_gcs_client_crc32c_is_not_verified_by_the_emulator(
    gcs_endpoint: GcsEndpoint, gcs_bucket: str
) -> None:
    """A wrong client CRC32C is stored over: a sink must compare the returned crc32c itself."""
    good = base64.b64encode(crc32c.crc32c(b"hello").to_bytes(4, "big")).decode()
    assert json_upload(gcs_endpoint, gcs_bucket, "ok", b"hello", crc32c=good)["crc32c"] == good
    assert json_upload(gcs_endpoint, gcs_bucket, "bad", b"hello", crc32c="AAAAAA==")["crc32c"] == good


def test_gcs_json_compose(gcs_endpoint: GcsEndpoint, gcs_bucket: str) -> None:
    for i in range(3):
        json_upload(gcs_endpoint, gcs_bucket, f"parts/{i}", bytes([65 + i]) * 10)
    body = json.dumps({"sourceObjects": [{"name": f"parts/{i}"} for i in range(3)], "destination": {}})
    status, text = gcs_endpoint.request(
        "POST",
        f"/storage/v1/b/{gcs_bucket}/o/final/compose",
        body.encode(),
        {"Content-Type": "application/json"},
    )
    assert status == 200 and json.loads(text)["size"] == "30"
    store = gcs_store(gcs_endpoint, gcs_bucket)
    assert bytes(obstore.get(store, "final").bytes()) == b"A" * 10 + b"B" * 10 + b"C" * 10
