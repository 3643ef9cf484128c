"""Which stage held each chunk of a save. A library that uploads behind its writes (s3dlio:
a write hands the part over; the close completes the upload) left the upload out of every
chunk's I/O time, and a save whose upload took 40 × its generation was "Generation"-bound."""

from __future__ import annotations

from asyncckpt.results.metrics import GENERATION, IO, ChunkRecord, label_chunks


def chunks(n: int, fill_s: float, write_s: float) -> list[ChunkRecord]:
    return [
        ChunkRecord(index=i, offset=i << 24, nbytes=1 << 24, fill_s=fill_s, write_s=write_s) for i in range(n)
    ]


def test_the_closes_wait_counts_as_the_chunks_io() -> None:
    # measured: 4 chunks of 16 MiB, generation 0.029 s in all, writes 0.011 s, close 1.206 s
    recs = chunks(4, fill_s=0.029 / 4, write_s=0.011 / 4)
    assert label_chunks(recs, 4, tail_s=1.206) == {IO: 4, GENERATION: 0}
    assert all(r.bottleneck == IO for r in recs)


def test_control_without_a_tail_the_same_chunks_are_generation_bound() -> None:
    recs = chunks(4, fill_s=0.029 / 4, write_s=0.011 / 4)
    assert label_chunks(recs, 4) == {IO: 0, GENERATION: 4}


def test_a_short_close_does_not_outweigh_slow_generation() -> None:
    recs = chunks(8, fill_s=0.05, write_s=0.02)  # an O_DIRECT file: the close is an fsync
    assert label_chunks(recs, 4, tail_s=0.002) == {IO: 0, GENERATION: 8}
