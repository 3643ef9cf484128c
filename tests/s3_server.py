"""Test helpers around the S3 servers of ``tests/plugins/s3servers.py``: an IAM user on an
authenticating moto, and a TCP relay that can be cut (a network outage mid-upload) or stall
(a server that stops answering mid-part, as under SIGSTOP)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import socket
import threading

import boto3

from asyncckpt.servers.s3endpoint import S3Endpoint


def provision_user(server: S3Endpoint) -> S3Endpoint:
    """On a moto started with ``MotoServer(auth=True)``: an IAM user allowed s3:*, as an endpoint.

    Uses the server's first three unauthenticated requests; after them moto enforces IAM.
    """
    iam = boto3.client(
        "iam",
        endpoint_url=server.endpoint,
        aws_access_key_id="x",
        aws_secret_access_key="y",
        region_name=server.region,
    )
    iam.create_user(UserName="ckpt")
    key = iam.create_access_key(UserName="ckpt")["AccessKey"]
    policy = {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}],
    }
    iam.put_user_policy(UserName="ckpt", PolicyName="s3", PolicyDocument=json.dumps(policy))
    return dataclasses.replace(server, access_key=key["AccessKeyId"], secret_key=key["SecretAccessKey"])


class TcpProxy:
    """A TCP relay in front of a server that can be cut at once: a network outage mid-upload.

    Cutting closes the listener and every relayed connection, so clients see resets and
    refused connections while the server behind (and what it stored) stays inspectable.
    """

    def __init__(
        self,
        target: str,
        *,
        drop_first: int = 0,
        stall_after: int | None = None,
        cut_after: int | None = None,
    ) -> None:
        """``drop_first``: close that many accepted connections at once (transient faults).

        ``cut_after``: once that many request bytes went to the server, the relay severs
        itself (:meth:`sever`) from the relaying thread, before forwarding more: an outage
        that lands at a byte count, whatever the client's timing (a cut triggered by the
        client's own progress report could come after a fast upload had already ended).

        ``stall_after``: once that many request bytes went to the server, nothing more moves
        either way on any connection, old or new, and nothing is closed: the server looks
        stopped (like SIGSTOP) until :meth:`cut`. ``stalled`` is set at that moment.
        """
        self.drop_first = drop_first
        self.stall_after = stall_after
        self.cut_after = cut_after
        self.sent = 0  # request bytes forwarded to the server
        self.stalled = threading.Event()
        self._cut = threading.Event()
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
            for a, b, up in ((client, upstream, True), (upstream, client, False)):
                t = threading.Thread(target=self._pump, args=(a, b, up), daemon=True)
                t.start()
                self._threads.append(t)

    def _pump(self, src: socket.socket, dst: socket.socket, upstream: bool) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(1 << 16):
                if upstream and self.cut_after is not None:
                    with self._lock:
                        room = self.cut_after - self.sent
                        self.sent += min(max(room, 0), len(data))
                    if room > 0:
                        dst.sendall(data[:room])
                    if room <= len(data):
                        self.sever()
                        return
                    continue
                if upstream and self.stall_after is not None and not self.stalled.is_set():
                    with self._lock:
                        room = self.stall_after - self.sent
                        self.sent += min(room, len(data))
                        if room <= len(data):
                            self.stalled.set()
                    data = data[: max(room, 0)]
                    if data:
                        dst.sendall(data)
                elif not self.stalled.is_set():
                    dst.sendall(data)
                if self.stalled.is_set():
                    self._cut.wait()  # hold the connection open, forward nothing, until cut()
                    return
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def cut(self) -> None:
        """Refuse new connections and reset every open one, then wait for the relay threads."""
        self.sever()
        for t in self._threads:
            t.join(timeout=5)

    def sever(self) -> None:
        """Refuse new connections and reset every open one, at once (no waiting: safe to call
        on an event loop, so the outage lands exactly where the test puts it)."""
        self._cut.set()
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        with self._lock:
            for sock in self._socks:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
