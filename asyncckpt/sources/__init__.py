"""Sources of checkpoint bytes: dgen-py (default), NumPy (baseline), caller data."""

from __future__ import annotations

from ..modes import Generator, choices
from .base import GenSpec, Source, ThreadedSource, fill_sequentially
from .caller import CallerData, CallerSource
from .dgen import DgenSource, pool_threads
from .numpy_gen import NumpySource
from .reader import ReaderSource, ReadFrom
from .spec import source_from_spec

GENERATORS = choices(Generator)


def make_source(
    generator: str,
    total_size: int,
    *,
    seed: int,
    threads: int,
    data: CallerData | ReadFrom | None = None,
) -> Source:
    """The source for one save: bytes read from storage or caller data when given, else the
    named generator."""
    if isinstance(data, ReadFrom):
        return ReaderSource(data, total_size)
    if data is not None:
        return CallerSource(data, total_size)
    if generator == "numpy":
        return NumpySource(total_size, seed=seed)
    return DgenSource(total_size, seed=seed, threads=threads)


__all__ = [
    "GENERATORS",
    "CallerData",
    "CallerSource",
    "DgenSource",
    "GenSpec",
    "NumpySource",
    "ReadFrom",
    "ReaderSource",
    "Source",
    "ThreadedSource",
    "fill_sequentially",
    "make_source",
    "pool_threads",
    "source_from_spec",
]
