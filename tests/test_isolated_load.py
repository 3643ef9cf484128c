"""An isolated load reads into the shared arena, whatever it loads (issue 24's defect).

``load_state`` once asked ``isinstance(sink, ProcessSink)`` of the watched wrapper, so an
isolated state load (the default for s3dlio and obstore) never attached the arena: every read
crossed the pipe in small messages (0.04x of ``load()``), and it started a second writer
process keyed without the arena. Both loads now ask the handle's capability.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from asyncckpt import AsyncCheckpointer

MiB = 1 << 20


def _state() -> dict[str, object]:
    rng = np.random.default_rng(7)
    return {"w": rng.standard_normal((512, 1024), dtype=np.float32), "step": 3}


async def test_isolated_load_state_reads_into_the_shared_arena(tmp_path: Path) -> None:
    uri = str(tmp_path / "state.safetensors")
    async with AsyncCheckpointer(chunk_size=MiB, num_buffers=4, isolation="process") as ckpt:
        saved = await ckpt.save_state(uri, _state())
        assert saved.save.metadata.extra["isolation"] == "process"
        loaded = await ckpt.load_state(uri)
        extra = loaded.load.metadata.extra
        assert extra.get("reads_inline", 0) == 0, extra
        assert extra["reads_arena"] >= 2
        np.testing.assert_array_equal(loaded.state["w"], _state()["w"])
        # one writer process served the save and the load: the arena's
        assert ckpt.storage.writers.started == 1


async def test_isolated_load_reads_into_the_shared_arena(tmp_path: Path) -> None:
    uri = str(tmp_path / "raw.bin")
    async with AsyncCheckpointer(chunk_size=MiB, num_buffers=4, isolation="process") as ckpt:
        await ckpt.save(uri, 6 * MiB)
        result = await ckpt.load(uri)
        extra = result.metadata.extra
        # every chunk into the arena; only the sealed footer (a small buffer) crossed the pipe
        assert extra["reads_arena"] >= 6
        assert extra.get("reads_inline", 0) <= 1, extra
        assert ckpt.storage.writers.started == 1
