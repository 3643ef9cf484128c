"""NumPy's PCG64 generator: the comparison baseline the dgen-py default replaces."""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import ThreadedSource

_STEP = 1 << 20


class NumpySource(ThreadedSource):
    """Seeded ``default_rng().bytes`` copied into the buffer (single-threaded)."""

    kind = "numpy"

    def __init__(self, total_size: int, *, seed: int) -> None:
        super().__init__(total_size)
        self.seed = seed
        self._rng = np.random.default_rng(seed)

    def fill_sync(self, buf: memoryview) -> int:
        # NumPy holds the GIL while generating: small steps let the event loop run between
        # them (the byte stream is the same as one large call)
        for start in range(0, len(buf), _STEP):
            end = min(start + _STEP, len(buf))
            buf[start:end] = self._rng.bytes(end - start)
        return len(buf)

    def describe(self) -> dict[str, Any]:
        return {"generator": self.kind, "seed": self.seed, "gen_threads": 1}
