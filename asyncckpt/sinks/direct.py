"""``direct://path``: local files with O_DIRECT required, as s3dlio's ``direct://`` means.

The file backend uses O_DIRECT when the file system accepts it and otherwise writes buffered,
saying so. Here a file system without a direct path to a device is refused, before anything is
written, with a :class:`DirectIOUnavailableError` naming the path and the file system:

- a file system whose files live in memory (tmpfs, ramfs): since Linux 6.6 tmpfs *accepts*
  O_DIRECT, but its files are page-cache pages, so nothing is bypassed and a "direct" figure
  would measure memory copies (refused from ``statfs`` before any file is made);
- one that refuses ``O_DIRECT`` on the new file (EINVAL): the temporary is removed again.

Every read is O_DIRECT too: a misaligned request (a footer, a manifest) reads the enclosing
aligned blocks into a page-aligned bounce buffer instead of using a buffered descriptor.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import errno
import mmap
import os
import sys
from pathlib import Path
from typing import Any

from ..blocking import run_blocking
from ..errors import ConfigError, DirectIOUnavailableError
from ..pool import buffer_address
from .file import ALIGN, FileSink, path_from_uri

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_O_DIRECT = getattr(os, "O_DIRECT", 0)

#: statfs f_type → name, for messages (Linux's magic numbers)
FILE_SYSTEMS = {
    0xEF53: "ext4",
    0x58465342: "xfs",
    0x9123683E: "btrfs",
    0x01021994: "tmpfs",
    0x858458F6: "ramfs",
    0x6969: "nfs",
    0x794C7630: "overlayfs",
    0x65735546: "fuse",
    0x2FC12FC1: "zfs",
    0x0BD00BD0: "lustre",
    0x47504653: "gpfs",
    0x01021997: "9p",
    0x00C36400: "ceph",
}
#: their files are page-cache pages: O_DIRECT, even when accepted, bypasses nothing
IN_MEMORY = frozenset({"tmpfs", "ramfs"})


def file_system_of(path: Path) -> str:
    """The file system of ``path``, or of its nearest existing ancestor ("unknown" off Linux)."""
    if not sys.platform.startswith("linux"):
        return "unknown"
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    buf = ctypes.create_string_buffer(256)  # struct statfs: f_type, a C long, comes first
    if _libc.statfs(os.fsencode(probe), buf) != 0:
        return "unknown"
    kind = ctypes.c_long.from_buffer(buf).value & 0xFFFFFFFF
    return FILE_SYSTEMS.get(kind, f"file system type {kind:#x}")


def check_direct_path(path: Path) -> None:
    """Refuse ``path`` before any I/O when its file system cannot do direct I/O."""
    if not _O_DIRECT:
        raise DirectIOUnavailableError(
            errno.EINVAL, f"direct:// {str(path)!r}: O_DIRECT is not available on this platform"
        )
    kind = file_system_of(path)
    if kind in IN_MEMORY:
        raise DirectIOUnavailableError(
            errno.EINVAL,
            f"direct:// {str(path)!r}: its file system ({kind}) keeps files in memory, so O_DIRECT "
            "bypasses no cache there; use a file system on a device, or a plain path",
        )


class DirectFileSink(FileSink):
    """One checkpoint file, written and read with O_DIRECT only (see the module docstring)."""

    backend = "direct"

    def __init__(self, uri: str, **kwargs: Any) -> None:
        super().__init__(uri, **kwargs)
        if self.options.direct_io is False:
            raise ConfigError(f"{uri!r} is direct:// (O_DIRECT required) but direct_io=False was given")
        self.options = dataclasses.replace(self.options, direct_io=True)

    @classmethod
    def check_root(cls, uri: str) -> None:
        super().check_root(uri)
        check_direct_path(path_from_uri(uri))

    def check(self) -> None:
        super().check()
        check_direct_path(self.path)

    def _open_sync(self, size: int) -> None:
        try:
            super()._open_sync(size)
        except DirectIOUnavailableError:
            raise
        except OSError as exc:  # the refusal of F_SETFL O_DIRECT (direct_io=True makes it raise)
            if exc.errno != errno.EINVAL or self.direct:
                raise
            kind = file_system_of(self.path)
            raise DirectIOUnavailableError(
                errno.EINVAL, f"direct:// {str(self.path)!r}: its file system ({kind}) refused O_DIRECT"
            ) from None
        self.direct_reason = f"O_DIRECT required by direct:// ({file_system_of(self.path)})"

    async def open_read(self, *, defeat_cache: bool = True) -> None:
        """Always O_DIRECT: ``defeat_cache=False`` would allow the page cache."""
        await run_blocking(self.executor, check_direct_path, self.path)  # statfs blocks
        await super().open_read(defeat_cache=True)

    def _open_read_sync(self, defeat_cache: bool) -> None:
        super()._open_read_sync(defeat_cache)
        if self._bfd >= 0:  # the buffered descriptor for misaligned reads: bounced here instead
            os.close(self._bfd)
            self._bfd = -1

    def _read_sync(self, offset: int, buf: memoryview) -> int:
        if not len(buf):
            return 0
        if self._rfd < 0:  # a one-off read (a manifest): its own O_DIRECT descriptor
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC | _O_DIRECT)
            try:
                return _bounced(fd, offset, buf)
            finally:
                os.close(fd)
        if not offset % ALIGN and not buffer_address(buf) % ALIGN:
            return self._read_direct(offset, buf)
        return _bounced(self._rfd, offset, buf)


def _bounced(fd: int, offset: int, buf: memoryview) -> int:
    """Read ``buf``'s range through the aligned blocks that hold it (O_DIRECT needs aligned
    offsets, lengths and addresses); the bytes read into ``buf``."""
    start = offset - offset % ALIGN
    end = -(-(offset + len(buf)) // ALIGN) * ALIGN
    with mmap.mmap(-1, end - start) as scratch:
        got = os.preadv(fd, [scratch], start)
        take = max(0, min(got - (offset - start), len(buf)))
        buf[:take] = scratch[offset - start : offset - start + take]
    return take
