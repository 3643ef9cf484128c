"""The S3 benchmarks' discard endpoint (benchmarks/s3_discard_server.py) must not add latency
of its own: its replies with a body go out as headers then body, and without TCP_NODELAY the
body waited for the client's delayed ACK (≈ 40 ms on Linux) on every CreateMultipartUpload
and CompleteMultipartUpload, ≈ 90 ms per measured upload, on both sides of every ratio."""

from __future__ import annotations

import http.client
import importlib.util
import socket
import threading
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _server_module() -> Any:
    spec = importlib.util.spec_from_file_location(
        "s3_discard_server", ROOT / "benchmarks" / "s3_discard_server.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_discard_endpoint_replies_without_waiting_for_the_clients_ack() -> None:
    mod = _server_module()
    seen: list[int] = []

    class Recording(mod.Handler):  # type: ignore[misc]  # a subclass of a module loaded at run time
        def setup(self) -> None:
            super().setup()  # the handler's own socket setup, then what it left on the socket
            seen.append(self.connection.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))

    with mod.Server(("127.0.0.1", 0), Recording) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=10)
            conn.request("POST", "/bench/key?uploads", body=b"")
            reply = conn.getresponse()
            body = reply.read()
            conn.close()
        finally:
            server.shutdown()
            thread.join()
    assert reply.status == 200 and b"<UploadId>" in body, body
    assert seen and all(seen), seen  # TCP_NODELAY on every accepted connection
