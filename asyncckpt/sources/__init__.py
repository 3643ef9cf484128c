"""Sources of checkpoint bytes: dgen-py (default), NumPy (baseline), caller data."""

from __future__ import annotations

from ..modes import Generator, choices
from .base import GenSpec, Source, ThreadedSource, fill_sequentially
from .caller import CallerData, CallerSource
from .dgen import DgenSource, pool_threads
from .numpy_gen import NumpySource
from .spec import source_from_spec

GENERATORS = choices(Generator)


def make_source(
    generator: str, total_size: int, *, seed: int, threads: int, data: CallerData | None = None
) -> Source:
    """The source for one save: caller data when given, else the named generator."""
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
    "Source",
    "ThreadedSource",
    "fill_sequentially",
    "make_source",
    "pool_threads",
    "source_from_spec",
]
