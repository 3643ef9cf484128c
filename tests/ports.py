"""Is a server still listening? A connect, and the kernel's socket tables to say who listens.

A bare ``connect_ex`` can mislead: a port given up by a stopped server can be bound again at
once by any process on the machine (ports chosen by ``bind(("", 0))`` come from the same
ephemeral range), and a connect to a free ephemeral port can, rarely, connect the socket to
itself. So a failing check names the process that listens, and a test asks whether that
process is one of its own.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from urllib.parse import urlsplit

LISTEN = "0A"  # the TCP state in /proc/net/tcp{,6}


def host_port(url: str) -> tuple[str, int]:
    """``http://host:port/...`` or ``host:port`` → (host, port)."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    assert parts.hostname is not None and parts.port is not None, url
    return parts.hostname, parts.port


def refused(url: str) -> bool:
    """True when nothing accepts a connection at ``url`` (a self-connection counts as refused)."""
    host, port = host_port(url)
    with socket.socket() as s:
        if s.connect_ex((host, port)) != 0:
            return True
        return bool(s.getsockname()[1] == port and s.getpeername()[1] == port)


def listening_inodes(port: int) -> set[str]:
    """Socket inodes in the LISTEN state on ``port`` (IPv4 and IPv6, any address)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == LISTEN:
                inodes.add(fields[9])
    return inodes


def listeners(url: str) -> dict[int, str]:
    """PID → command line of every process holding a listening socket on ``url``'s port."""
    inodes = {f"socket:[{inode}]" for inode in listening_inodes(host_port(url)[1])}
    found: dict[int, str] = {}
    if not inodes:
        return found
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
            if any(os.readlink(f"/proc/{entry}/fd/{fd}") in inodes for fd in fds):
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
                found[int(entry)] = cmd.strip()
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


def nothing_of_ours_listens(url: str, markers: tuple[str, ...]) -> tuple[bool, dict[int, str]]:
    """Whether ``url`` refuses connections or only processes without any of ``markers`` in their
    command line listen there; also who listens, for the assertion's message."""
    if refused(url):
        return True, {}
    who = listeners(url)
    return not any(m in cmd for cmd in who.values() for m in markers), who
