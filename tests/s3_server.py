"""A real S3 HTTP server for tests: moto's ThreadedMotoServer on 127.0.0.1, port 0.

The server runs in its own Python process (``python -m tests.s3_server``): in the test
process its request handling would hold the GIL and show up as event-loop stalls that the
blocking-call detector must attribute to the code under test. Stopping it is a real outage.
Never talks to AWS: clients point at the local server with fake credentials.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

import boto3
from botocore.config import Config
from moto.server import ThreadedMotoServer

ACCESS_KEY = "testing-access-key"
SECRET_KEY = "test-secret-Zq8vW3kP"  # distinctive: tests assert it never appears in output
REGION = "us-east-1"


@dataclass
class MotoS3:
    """A running moto server and the settings a client needs to reach it."""

    process: subprocess.Popen[str]
    endpoint: str
    _clients: dict[tuple[str, str], Any] = field(default_factory=dict)

    @classmethod
    def start(cls, *, auth: bool = False) -> MotoS3:
        """A moto server; with ``auth`` it enforces IAM credentials (see :meth:`provision_user`)."""
        env = dict(os.environ)
        if auth:  # the next 3 requests (provision_user) run unauthenticated, then auth applies
            env["INITIAL_NO_AUTH_ACTION_COUNT"] = "3"
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.s3_server"],
            env=env,
            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert proc.stdout is not None
        line = proc.stdout.readline()  # "ENDPOINT http://127.0.0.1:PORT" once bound
        if not line.startswith("ENDPOINT "):
            proc.kill()
            proc.wait()
            raise RuntimeError(f"moto server did not start: {line!r}")
        return cls(proc, line.split()[1])

    def stop(self) -> None:
        """Stop the server now (also used as an outage in fault tests); idempotent."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                stream.close()

    def env(self) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": REGION,
        }

    def options(self, **extra: Any) -> dict[str, Any]:
        """Explicit backend_options (independent of the process environment)."""
        return {
            "endpoint_url": self.endpoint,
            "access_key_id": ACCESS_KEY,
            "secret_access_key": SECRET_KEY,
            "region": REGION,
            "dotenv": False,
            **extra,
        }

    def client(self, key_id: str = ACCESS_KEY, secret: str = SECRET_KEY) -> Any:
        """An independent boto3 client for verifying what the sinks wrote (cached; thread-safe)."""
        if (key_id, secret) not in self._clients:
            self._clients[key_id, secret] = self._new_client(key_id, secret)
        return self._clients[key_id, secret]

    def _new_client(self, key_id: str, secret: str) -> Any:
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=key_id,
            aws_secret_access_key=secret,
            region_name=REGION,
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
        )

    def provision_user(self) -> tuple[str, str]:
        """On an ``auth`` server: an IAM user allowed s3:*; returns (access key id, secret)."""
        iam = boto3.client(
            "iam",
            endpoint_url=self.endpoint,
            aws_access_key_id="x",
            aws_secret_access_key="y",
            region_name=REGION,
        )
        iam.create_user(UserName="ckpt")
        key = iam.create_access_key(UserName="ckpt")["AccessKey"]
        policy = {
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}],
        }
        iam.put_user_policy(UserName="ckpt", PolicyName="s3", PolicyDocument=json.dumps(policy))
        return key["AccessKeyId"], key["SecretAccessKey"]

    def create_bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        return name


class TcpProxy:
    """A TCP relay in front of a server that can be cut at once: a network outage mid-upload.

    Cutting closes the listener and every relayed connection, so clients see resets and
    refused connections while the server behind (and what it stored) stays inspectable.
    """

    def __init__(self, target: str, *, drop_first: int = 0) -> None:
        """``drop_first``: close that many accepted connections at once (transient faults)."""
        self.drop_first = drop_first
        host, port = target.removeprefix("http://").split(":")
        self.target = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.drop_first > 0:
                self.drop_first -= 1
                client.close()
                continue
            upstream = socket.create_connection(self.target)
            with self._lock:
                self._socks += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                t = threading.Thread(target=self._pump, args=(a, b), daemon=True)
                t.start()
                self._threads.append(t)

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(1 << 16):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def cut(self) -> None:
        """Refuse new connections and reset every open one."""
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        with self._lock:
            for sock in self._socks:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
        for t in self._threads:
            t.join(timeout=5)


def serve() -> None:
    """Run moto on 127.0.0.1, port 0; print the endpoint; exit when stdin closes."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()  # the port the OS actually bound
    print(f"ENDPOINT http://{host}:{port}", flush=True)
    done = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
    done.wait()
    server.stop()


if __name__ == "__main__":
    serve()
