"""Attributes renamed in this release that still answer under their old name, with a warning.

Loads used to report reads under the save's write-named fields; callers get one release to move
to the new names, and the warning names the field to use.
"""

from __future__ import annotations

import warnings
from typing import Any, Generic, NoReturn, TypeVar, overload

T = TypeVar("T")


class Renamed(Generic[T]):
    """A read-only class attribute ``old = Renamed[float]("new")``: reading warns, then reads ``new``."""

    def __init__(self, new: str) -> None:
        self.new = new
        self.old = ""

    def __set_name__(self, owner: type[Any], name: str) -> None:
        self.old = name

    @overload
    def __get__(self, obj: None, owner: type[Any] | None = None) -> Renamed[T]: ...
    @overload
    def __get__(self, obj: object, owner: type[Any] | None = None) -> T: ...
    def __get__(self, obj: object | None, owner: type[Any] | None = None) -> Renamed[T] | T:
        if obj is None:
            return self
        warnings.warn(
            f"{type(obj).__name__}.{self.old} is deprecated (removed in the next release): use {self.new}",
            DeprecationWarning,
            stacklevel=2,
        )
        value: T = getattr(obj, self.new)
        return value

    def __set__(self, obj: object, value: object) -> NoReturn:
        raise AttributeError(f"{self.old} is a read-only deprecated alias of {self.new}")
