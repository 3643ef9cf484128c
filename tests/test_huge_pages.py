"""In-process buffers are private memory advised for transparent huge pages; a writer process's
arena stays shared. Read from the kernel's own account of each mapping (/proc/self/smaps)."""

from __future__ import annotations

import mmap
import sys
from pathlib import Path

import pytest

from asyncckpt.pool import BufferPool, buffer_address
from asyncckpt.sinks.isolation import SharedBufferPool
from asyncckpt.state.staging import StagingArea

pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or not hasattr(mmap, "MADV_HUGEPAGE"), reason="Linux madvise flags"
)


def vm_flags(address: int) -> set[str]:
    """The VmFlags of the mapping that holds ``address``."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            start, end = (int(x, 16) for x in head.split("-"))
            inside = start <= address < end
        elif inside and head == "VmFlags:":
            return set(line.split()[1:])
    raise AssertionError(f"no mapping holds {address:#x}")


def test_pool_and_staging_area_are_private_huge_page_memory() -> None:
    pool = BufferPool(2 << 20, 2)
    area = StagingArea()
    try:
        pool.touch()
        flags = vm_flags(buffer_address(pool.buffers[0].view))
        assert "hg" in flags and "sh" not in flags, flags  # hg: MADV_HUGEPAGE; sh: shared
        view = area.ensure(3 << 20)
        view[:] = b"\1" * len(view)
        flags = vm_flags(buffer_address(view))
        assert "hg" in flags and "sh" not in flags, flags
        view.release()
    finally:
        pool.close()
        area.close()


def test_writer_process_arena_stays_shared() -> None:
    pool = SharedBufferPool(2 << 20, 2)
    try:
        assert "sh" in vm_flags(buffer_address(pool.buffers[0].view))
    finally:
        pool.close()
