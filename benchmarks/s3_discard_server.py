"""BENCHMARK TOOL, NOT A STORE: an S3 endpoint that reads every upload and throws it away.

It measures clients, not storage: CreateMultipartUpload, UploadPart, CompleteMultipartUpload,
AbortMultipartUpload, PutObject and HeadObject answer with valid responses (ETags are fake
but well-formed), and nothing is kept. Any credentials are accepted, no signature is checked.
Bodies are drained with ``recv_into`` into one reused buffer per connection (aws-chunked
bodies are drained by their framing). Binds 127.0.0.1 only.

    python benchmarks/s3_discard_server.py [--port 0]   # prints "ENDPOINT http://127.0.0.1:PORT"
"""

from __future__ import annotations

import argparse
import hashlib
import socketserver
import sys
import threading
import uuid
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, urlsplit

XML = '<?xml version="1.0" encoding="UTF-8"?>\n'
NS = 'xmlns="http://s3.amazonaws.com/doc/2006-03-01/"'
SIZES: dict[str, int] = {}  # key → size of the last completed PUT (for HEAD)
LOCK = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "s3-discard"
    # a reply with a body leaves as two sends (headers, then body): without TCP_NODELAY the
    # body waits for the client's delayed ACK, ≈ 40 ms per CreateMultipartUpload and
    # CompleteMultipartUpload, which every measured upload (direct or asyncckpt) paid
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: object) -> None:  # quiet
        return

    def _drain(self) -> int:
        buf = getattr(self, "_buf", None)
        if buf is None:
            buf = self._buf = memoryview(bytearray(1 << 20))
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            total = 0
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return total
                total += self._read_n(size, buf)
                self.rfile.readline()
        return self._read_n(int(self.headers.get("Content-Length", 0)), buf)

    def _read_n(self, n: int, buf: memoryview) -> int:
        left = n
        while left:
            got = self.rfile.readinto(buf[: min(left, len(buf))])
            if not got:
                break
            left -= got
        return n - left

    def _reply(self, status: int, body: str = "", headers: dict[str, str] | None = None) -> None:
        data = (XML + body).encode() if body else b""
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        if data:
            self.send_header("Content-Type", "application/xml")
        self.end_headers()
        self.wfile.write(data)

    def _target(self) -> tuple[str, str, dict[str, list[str]]]:
        parts = urlsplit(self.path)
        bucket, _, key = parts.path.lstrip("/").partition("/")
        return bucket, key, parse_qs(parts.query, keep_blank_values=True)

    def do_POST(self) -> None:
        bucket, key, q = self._target()
        self._drain()
        if "uploads" in q:
            body = (
                f"<InitiateMultipartUploadResult {NS}><Bucket>{bucket}</Bucket><Key>{key}</Key>"
                f"<UploadId>{uuid.uuid4().hex}</UploadId></InitiateMultipartUploadResult>"
            )
            return self._reply(200, body)
        if "uploadId" in q:
            etag = '"' + hashlib.md5(q["uploadId"][0].encode()).hexdigest() + '-1"'
            body = (
                f"<CompleteMultipartUploadResult {NS}><Location>/{bucket}/{key}</Location>"
                f"<Bucket>{bucket}</Bucket><Key>{key}</Key><ETag>{etag}</ETag></CompleteMultipartUploadResult>"
            )
            return self._reply(200, body)
        if "delete" in q:  # DeleteObjects (s3dlio's only delete): accepted; the body is not kept
            return self._reply(200, f"<DeleteResult {NS}></DeleteResult>")
        return self._reply(400, f"<Error><Code>NotImplemented</Code><Message>{self.path}</Message></Error>")

    def do_PUT(self) -> None:
        bucket, key, q = self._target()
        n = self._drain()
        etag = '"' + hashlib.md5(f"{key}{n}{q.get('partNumber')}".encode()).hexdigest() + '"'
        if "partNumber" not in q:
            with LOCK:
                SIZES[f"{bucket}/{key}"] = n
        self._reply(200, headers={"ETag": etag})

    def do_DELETE(self) -> None:
        bucket, key, q = self._target()
        if "uploadId" not in q:
            with LOCK:
                SIZES.pop(f"{bucket}/{key}", None)
        self._reply(204)

    def do_HEAD(self) -> None:
        bucket, key, _ = self._target()
        with LOCK:
            size = SIZES.get(f"{bucket}/{key}")
        if size is None:
            return self._reply(404)
        self.send_response(200)
        self.send_header("Content-Length", str(size))
        self.send_header("ETag", '"0"')
        self.end_headers()


class Server(socketserver.ThreadingMixIn, socketserver.TCPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args()
    with Server(("127.0.0.1", args.port), Handler) as server:
        host, port = server.server_address[:2]
        print(f"ENDPOINT http://{host}:{port}", flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            sys.exit(0)


if __name__ == "__main__":
    main()
