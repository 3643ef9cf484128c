"""CRC32C combining: the whole-object checksum in a manifest equals a real CRC32C of the bytes."""

from __future__ import annotations

import os
import random

import crc32c
import pytest

from asyncckpt.checksum import combine, combine_all, crc


@pytest.mark.parametrize("cut", [0, 1, 7, 4096, 65535, 65536])
def test_combine_two_parts(cut: int) -> None:
    data = os.urandom(65536)
    a, b = data[:cut], data[cut:]
    assert combine(crc(a), crc(b), len(b)) == crc(data) == crc32c.crc32c(data)


def test_combine_many_uneven_parts() -> None:
    rng = random.Random(1)
    data = os.urandom(300_000)
    cuts = sorted(rng.sample(range(1, len(data)), 40))
    parts = [data[i:j] for i, j in zip([0, *cuts], [*cuts, len(data)], strict=True)]
    assert combine_all((crc(p), len(p)) for p in parts) == crc(data)
    assert combine_all((crc(p), len(p)) for p in reversed(parts)) != crc(data)  # order matters
