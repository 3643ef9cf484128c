"""Who left a temporary object: host, boot and pid, recorded in its name.

A save's temporary file is named after its owner, so a later save (or ``cleanup``) can tell
a dead save's leftovers from a live save's work in progress: only a name from this host and
this boot whose pid no longer exists is provably abandoned. Anything else (another host, an
earlier boot, a name of asyncckpt < 0.2) is left for ``cleanup --older-than``.

The same rule covers the *aside* name an overwrite links the replaced file to before its
rename (``.replaced`` instead of ``.partial``): it only ever holds a version that was
published, so removing it never touches what the target path shows.
"""

from __future__ import annotations

import os
import re
import socket
import uuid
from dataclasses import dataclass
from functools import lru_cache

TEMP_SUFFIX = ".partial"
#: the suffix of a replaced file's aside name (a second link, dropped after the save)
ASIDE_SUFFIX = ".replaced"
_TAG = "ackpt"
_NAME = re.compile(
    r"^\.(?P<name>.+)\." + _TAG + r"~(?P<host>[A-Za-z0-9.-]{1,64})~(?P<boot>[0-9a-f]{8})~"
    r"(?P<pid>\d{1,10})~(?P<nonce>[0-9a-f]{8})"
    r"(?P<suffix>" + re.escape(TEMP_SUFFIX) + "|" + re.escape(ASIDE_SUFFIX) + ")$"
)
#: temporary names of asyncckpt < 0.2 (no owner): only ``cleanup --older-than`` removes them
LEGACY_TEMP = re.compile(r"^\..+\.[0-9a-f]{12}" + re.escape(TEMP_SUFFIX) + "$")


@lru_cache(maxsize=1)
def boot_id() -> str:
    """Eight hex digits naming this boot (pids restart at each boot)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip().replace("-", "")[:8]
    except OSError:
        return "00000000"


def host() -> str:
    name = re.sub(r"[^A-Za-z0-9.-]", "-", socket.gethostname())[:64]
    return name or "localhost"


@dataclass(frozen=True)
class Owner:
    name: str  # the object the temporary was going to become (or, aside, was replaced at)
    host: str
    boot: str
    pid: int
    replaced: bool = False  # an aside name of a replaced file, not a temporary

    def state(self) -> str:
        """``dead`` (this host and boot, process gone), ``alive`` (this host and boot, process
        there) or ``unknown`` (another host or boot: nothing here can tell)."""
        if self.host != host() or self.boot != boot_id():
            return "unknown"
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return "dead"
        except PermissionError:
            return "alive"  # someone else's process
        return "dead" if _zombie(self.pid) else "alive"

    def provably_dead(self) -> bool:
        """True only for a save of this host and boot whose process is gone."""
        return self.state() == "dead"


def _zombie(pid: int) -> bool:
    """A process that exited but was not reaped (an orphan under a PID 1 that does not reap,
    as in containers): it still answers kill(pid, 0) yet never runs again."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state in ("Z", "X")


def temp_name(name: str) -> str:
    """A temporary name for object ``name`` that records its owner (this process)."""
    return _owned_name(name, TEMP_SUFFIX)


def aside_name(name: str) -> str:
    """A hidden name, recording its owner (this process), to link the file ``name`` is about
    to replace to, so that the rename drops no last link (``sinks/file.py``)."""
    return _owned_name(name, ASIDE_SUFFIX)


def _owned_name(name: str, suffix: str) -> str:
    return f".{name}.{_TAG}~{host()}~{boot_id()}~{os.getpid()}~{uuid.uuid4().hex[:8]}{suffix}"


def owned_dir_prefix(prefix: str) -> str:
    """The start of a temporary directory's name that records its owner (this process), for
    ``tempfile.mkdtemp(prefix=...)``: a later run can tell a killed run's directory."""
    return f"{prefix}{_TAG}~{host()}~{boot_id()}~{os.getpid()}~"


def parse_owned_dir(prefix: str, name: str) -> Owner | None:
    """The owner recorded in a directory name made with :func:`owned_dir_prefix`, or None."""
    m = re.match(
        re.escape(prefix) + _TAG + r"~(?P<host>[A-Za-z0-9.-]{1,64})~(?P<boot>[0-9a-f]{8})~"
        r"(?P<pid>\d{1,10})~[A-Za-z0-9_]{1,32}$",
        name,
    )
    return None if m is None else Owner(name, m["host"], m["boot"], int(m["pid"]))


def parse_temp(name: str) -> Owner | None:
    """The owner recorded in a temporary (or aside) name, or None if it is not one of ours."""
    m = _NAME.match(name)
    if m is None:
        return None
    return Owner(m["name"], m["host"], m["boot"], int(m["pid"]), m["suffix"] == ASIDE_SUFFIX)
