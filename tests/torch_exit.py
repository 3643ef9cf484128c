"""How a torch.distributed test child ends: without interpreter finalization.

A gloo worker thread can drop its last reference to a finished collective (and so to the
Python-owned tensors the collective held) after the rank that waited on it has moved on. When
that lands inside interpreter finalization, the worker cannot take the GIL, the interpreter
ends the thread with a forced unwind through a ``noexcept`` destructor, and the whole rank
aborts with ``terminate called without an active exception`` although every check passed
(seen in CI under load; core dump: ``AsyncAllgatherWork::~AsyncAllgatherWork`` in
``ProcessGroupGloo::runLoop`` during ``Py_FinalizeEx``; torch's proposed fix, an atexit
``destroy_process_group``, is pytorch/pytorch#179291, not merged). A child whose work is
done, its checkpointers closed and its process group destroyed leaves with ``os._exit``, so no
finalization runs beside the gloo threads. ``dcp_process_child`` does not: DCP's checkpoint
daemon is stopped by multiprocessing's own exit handler.
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn


def leave() -> NoReturn:
    """Flush and exit 0 at once (only after the child's own closing and checks are done)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
