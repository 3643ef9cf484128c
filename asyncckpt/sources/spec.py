"""A source from its recipe: above both ``base`` (the recipe) and the generators it names."""

from __future__ import annotations

from .base import GenSpec, ThreadedSource
from .dgen import DgenSource


def source_from_spec(spec: GenSpec) -> ThreadedSource:
    """A fresh source at position 0 (in the calling process: starts its thread pool)."""
    if spec.generator != "dgen":
        raise ValueError(f"no in-place recipe for generator {spec.generator!r}")
    return DgenSource(spec.total_size, seed=spec.seed, threads=spec.threads)
