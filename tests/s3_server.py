"""A real S3 HTTP server for tests: moto's ThreadedMotoServer on 127.0.0.1, port 0.

The server runs in its own Python process (``python -m tests.s3_server``): in the test
process its request handling would hold the GIL and show up as event-loop stalls that the
blocking-call detector must attribute to the code under test. Stopping it is a real outage.
Never talks to AWS: clients point at the local server with fake credentials.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from dataclasses import dataclass
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

    @classmethod
    def start(cls) -> MotoS3:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.s3_server"],
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

    def client(self) -> Any:
        """An independent boto3 client for verifying what the sinks wrote."""
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name=REGION,
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
        )

    def create_bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        return name


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
