"""Start-up requests to the embedded servers retry within a deadline (issue 13 item 6).

A loopback HTTP server answers the first bucket creations the way the embedded Swift did
right after start-up (503 "Please reduce your request rate"), then accepts.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from asyncckpt import StorageError
from asyncckpt.servers.s3endpoint import S3Endpoint

SLOWDOWN = (
    b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>ServiceUnavailable</Code>"
    b"<Message>Please reduce your request rate.</Message></Error>"
)


class Busy(ThreadingHTTPServer):
    refuse = 0  # answers of `status` before the first 200
    status = 503
    seen = 0


class Handler(BaseHTTPRequestHandler):
    server: Busy

    def do_PUT(self) -> None:
        self.server.seen += 1
        if self.server.seen <= self.server.refuse:
            self.send_response(self.server.status)
            body = SLOWDOWN if self.server.status == 503 else b"<Error><Code>AccessDenied</Code></Error>"
        else:
            self.send_response(200)
            body = b""
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def busy() -> Iterator[tuple[Busy, S3Endpoint]]:
    server = Busy(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server, S3Endpoint("swift", f"http://127.0.0.1:{server.server_address[1]}", "k", "s")
    server.shutdown()
    server.server_close()
    thread.join()


def test_bucket_creation_retries_a_server_still_starting(busy: tuple[Busy, S3Endpoint]) -> None:
    server, ep = busy
    server.refuse = 3
    assert ep.create_bucket("b1") == "b1"
    assert server.seen == 4


def test_bucket_creation_gives_up_at_its_deadline(busy: tuple[Busy, S3Endpoint]) -> None:
    server, ep = busy
    server.refuse = 10**6
    started = time.monotonic()
    with pytest.raises(StorageError, match=r"HTTP 503.*reduce your request rate"):
        ep.create_bucket("b2", deadline_s=0.5)
    assert time.monotonic() - started < 3


def test_bucket_creation_does_not_retry_a_refusal(busy: tuple[Busy, S3Endpoint]) -> None:
    server, ep = busy
    server.refuse, server.status = 5, 403
    with pytest.raises(StorageError, match="HTTP 403"):
        ep.create_bucket("b3")
    assert server.seen == 1
