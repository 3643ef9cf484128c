"""An HTTP/1.1 relay on 127.0.0.1 in front of a test S3 server that spoils or counts requests.

``FaultyFront`` relays HTTP to moto and spoils chosen requests: ``cut`` forwards the head and
half the body of a request, then closes both connections (a reset mid-part); ``busy`` reads
the request whole and answers ``503 SlowDown`` itself; ``deny`` answers ``403 AccessDenied``,
``unauthorized`` ``401``.
``short`` relays the request but cuts its response after 1 MiB; ``hold`` never forwards it
(the client waits: a crash test kills it then, through ``on_spoil``); ``flip`` relays it with
the last byte of its body inverted (corruption on the way); ``stall`` never forwards it and
keeps the connection open without an answer until the relay stops (a store that stopped
answering); ``pass`` spoils nothing.
Every matching request's body relay is counted, so ``peak`` is the most matching requests the
server was receiving at once (how many parts a client really keeps in flight).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Awaitable, Callable

_PART = re.compile(r"^PUT \S*partNumber=(\d+)")


def is_part(line: str) -> bool:
    return _PART.match(line) is not None


def part_number(line: str) -> int:
    m = _PART.match(line)
    assert m is not None, line
    return int(m.group(1))


def is_part_2(line: str) -> bool:
    return (m := _PART.match(line)) is not None and m.group(1) == "2"


def is_create(line: str) -> bool:
    return line.startswith("POST ") and line.split()[1].endswith("?uploads")


#: mode → (status, reason, S3 error code, message) of the answer the front end gives itself
ANSWERS = {
    "busy": (503, "Slow Down", "SlowDown", "Please reduce your request rate."),
    "deny": (403, "Forbidden", "AccessDenied", "Access Denied"),
    # a credential refused before its expiry (GCS: a revoked token)
    "unauthorized": (401, "Unauthorized", "authError", "Invalid Credentials"),
}


ANSWER_WAIT_S = 30.0  # a bound on a test's time, not a synchronisation


class FaultyFront:
    """An HTTP/1.1 relay on 127.0.0.1 in front of moto that spoils matching requests."""

    def __init__(
        self,
        target: str,
        mode: str,
        match: Callable[[str], bool],
        times: int = 1,
        on_spoil: Callable[[], None] | None = None,
        wait_for_second_s: float = 0.0,
        before: Callable[[str], Awaitable[None]] | None = None,
    ) -> None:
        host, port = target.removeprefix("http://").split(":")
        self.target = (host, int(port))
        self.mode, self.match, self.left = mode, match, times
        self.on_spoil = on_spoil  # called as a request is spoiled, before anything is sent
        self.before = before  # awaited before a matching request goes on (another client's turn)
        self.spoiled: list[str] = []  # request lines that were spoiled
        self.matched: list[str] = []  # every matching request line seen
        self.heads: list[str] = []  # the head (request line and headers) of each of them
        self.active = 0  # matching requests whose body is being relayed now
        self.peak = 0  # the most there ever were at once
        self.connections = 0  # TCP connections clients opened to the relay
        # > 0: the first matching request's body waits (at most this long) for a second one to
        # arrive, so ``peak`` shows whether a client *can* keep two in flight, whatever the
        # speeds: on a loaded machine a part was often relayed whole before the next was made
        self.wait_for_second_s = wait_for_second_s
        self._second = asyncio.Event()
        self._stopped = asyncio.Event()  # ``stall`` holds its requests until then
        self._tasks: set[asyncio.Task[None]] = set()
        # ``short``: a spoiled request relayed whole gets its answer from the server (awaited
        # before its connection closes and by ``stop``): a store that commits on it (GCS's
        # final chunk) has then committed, so what a test reads next is settled
        self._answers: list[asyncio.Task[None]] = []

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def stop(self) -> None:
        self._stopped.set()
        if self._answers:
            await asyncio.wait(self._answers, timeout=ANSWER_WAIT_S)
        self.server.close()
        await self.server.wait_closed()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    @staticmethod
    async def _pump(
        src: asyncio.StreamReader, dst: asyncio.StreamWriter, sent: list[int], moved: asyncio.Event
    ) -> None:
        """Responses, passed through until ``sent[0]`` bytes went by ``sent[1]`` (the cut);
        ``moved`` is set at each piece and at the end (``sent[2]`` = 1)."""
        try:
            with contextlib.suppress(OSError, asyncio.IncompleteReadError):
                while data := await src.read(1 << 16):
                    dst.write(data[: max(0, sent[1] - sent[0])])
                    sent[0] += len(data)
                    moved.set()
                    if sent[0] >= sent[1]:
                        break
                    await dst.drain()
            dst.transport.abort() if sent[0] >= sent[1] else dst.close()
        finally:
            sent[2] = 1
            moved.set()

    @staticmethod
    async def _answered(sent: list[int], mark: int, moved: asyncio.Event) -> None:
        """Until the server answered past ``mark`` bytes of responses, or closed."""
        while sent[0] <= mark and not sent[2]:
            moved.clear()
            await moved.wait()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        up_r, up_w = await asyncio.open_connection(*self.target)
        sent = [0, 1 << 62, 0]  # response bytes relayed so far; where to cut them; upstream ended
        moved = asyncio.Event()
        back = asyncio.create_task(self._pump(up_r, writer, sent, moved))
        answer: asyncio.Task[None] | None = None
        self._tasks.add(back)
        back.add_done_callback(self._tasks.discard)
        try:
            while True:  # one request per turn: clients do not pipeline
                head = await reader.readuntil(b"\r\n\r\n")
                text = head.decode("latin-1")
                line, low = text.split("\r\n", 1)[0], text.lower()
                length = int(m.group(1)) if (m := re.search(r"(?:^|\r\n)content-length:\s*(\d+)", low)) else 0
                hit = self.match(line)  # once per request: a matcher may count
                if hit:
                    self.matched.append(line)
                    self.heads.append(text)
                    if self.before is not None:
                        await self.before(line)
                    if self.left > 0:
                        self.left -= 1
                        self.spoiled.append(line)
                        if self.on_spoil is not None:
                            self.on_spoil()
                        if self.mode == "short":  # relayed, but its response stops after 1 MiB
                            sent[1] = sent[0] + (1 << 20)
                            up_w.write(head)
                            await self._relay(reader, up_w, length)
                            answer = asyncio.create_task(self._answered(sent, sent[0], moved))
                            self._answers.append(answer)
                            continue
                        elif self.mode == "flip":  # relayed with its body's last byte inverted
                            up_w.write(head)
                            await self._relay(reader, up_w, length - 1)
                            up_w.write(bytes([(await reader.readexactly(1))[0] ^ 0xFF]) if length else b"")
                            continue
                        else:
                            await self._spoil(head, low, length, reader, writer, up_w)
                            return
                up_w.write(head)
                counted = hit
                self.active += counted
                self.peak = max(self.peak, self.active)
                if counted and self.wait_for_second_s > 0:
                    await self._await_second()
                try:
                    await self._relay(reader, up_w, length)
                finally:
                    self.active -= counted
        except (asyncio.IncompleteReadError, OSError):
            pass
        finally:
            if answer is not None:
                await asyncio.wait([answer], timeout=ANSWER_WAIT_S)
            up_w.transport.abort()
            writer.transport.abort()

    async def _await_second(self) -> None:
        """Hold this request until another matching one is active; after one wait that timed
        out (the client keeps one in flight) nothing is held any more."""
        if self.active > 1:
            self._second.set()
        if self._second.is_set():
            return
        try:
            await asyncio.wait_for(self._second.wait(), self.wait_for_second_s)
        except TimeoutError:
            self._second.set()  # a bound on the test's time, not a synchronisation: peak stays 1

    @staticmethod
    async def _relay(reader: asyncio.StreamReader, dst: asyncio.StreamWriter, n: int) -> None:
        while n > 0:
            data = await reader.read(min(n, 1 << 16))
            if not data:
                raise asyncio.IncompleteReadError(b"", n)
            dst.write(data)
            await dst.drain()
            n -= len(data)

    async def _spoil(
        self,
        head: bytes,
        low: str,
        length: int,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        up_w: asyncio.StreamWriter,
    ) -> None:
        if self.mode == "hold":  # the server never sees it
            return
        if self.mode == "stall":  # nor does the client get an answer, or a closed connection
            await self._stopped.wait()
            return
        if self.mode == "cut":  # moto sees half a request; the client a reset mid-body
            up_w.write(head)
            await self._relay(reader, up_w, length // 2)
            return
        status, reason, code, message = ANSWERS[self.mode]
        if "expect: 100-continue" in low:
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        await reader.readexactly(length)
        body = f"<?xml version='1.0'?><Error><Code>{code}</Code><Message>{message}</Message></Error>"
        payload = b"" if low.startswith("head ") else body.encode()
        writer.write(
            f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/xml\r\nConnection: close\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n".encode()
            + payload
        )
        await writer.drain()


@contextlib.asynccontextmanager
async def counting(endpoint: str, wait_for_second_s: float = 0.0) -> AsyncIterator[tuple[FaultyFront, str]]:
    """A relay before ``endpoint`` that spoils nothing and counts (parts at once, connections);
    yields it and its URL, and stops it afterwards."""
    front = FaultyFront(endpoint, "pass", is_part, times=0, wait_for_second_s=wait_for_second_s)
    url = await front.start()
    try:
        yield front, url
    finally:
        await front.stop()
