"""Array leaves as raw little-endian C-order bytes, without copying when that is possible.

Saving: a C-contiguous little-endian NumPy array or contiguous CPU torch tensor is exposed
as a byte view of its own memory. Anything else (non-contiguous, Fortran order, big-endian,
a conjugate/negative torch view) needs its bytes rearranged: with ``staging="none"`` that
one array is copied into a contiguous temporary (memory: that array's size, for the
duration of the save); with ``staging="host"`` it is copied straight into the staging area.

Loading: destinations are fresh arrays, or the caller's own (``into=``), filled in place;
a non-contiguous destination is filled through a temporary and copied at the end.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..engine import dtypes
from ..engine.dtypes import DType
from ..engine.safetensors_format import TensorEntry
from ..errors import ConfigError, MissingDependencyError
from .flatten import Leaf, is_array, is_torch_tensor, path_text
from .shard import Shard, check_box, dtensor_box, is_dtensor

_LE = "<" if sys.byteorder == "little" else ">"


def _bytes_of(array: np.ndarray[Any, Any]) -> memoryview:
    """1-D uint8 view of a C-contiguous array (0-d and empty arrays included)."""
    return memoryview(array.reshape(-1).view(np.uint8))  # type: ignore[arg-type]


def _torch_bytes(tensor: Any) -> memoryview:
    torch = sys.modules["torch"]
    flat = tensor.reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy())


@dataclass
class SaveTensor:
    """One array leaf ready to be saved."""

    leaf: Leaf
    dtype: DType
    shape: tuple[int, ...]
    nbytes: int
    source: Any  # np.ndarray or torch.Tensor (detached)
    contiguous: bool  # ``source``'s memory already holds the file's bytes
    #: (global shape, offsets) of a sharded leaf's box; None for a whole tensor
    box: tuple[tuple[int, ...], tuple[int, ...]] | None = None

    def byte_view(self) -> memoryview:
        if not self.contiguous:
            raise RuntimeError(f"{self.leaf.name}: not contiguous; make_contiguous() first")
        return _torch_bytes(self.source) if is_torch_tensor(self.source) else _bytes_of(self.source)

    def make_contiguous(self) -> None:
        """Replace the source by a contiguous little-endian copy (blocking: a worker thread)."""
        if self.contiguous:
            return
        if is_torch_tensor(self.source):
            self.source = self.source.resolve_conj().resolve_neg().contiguous()
        else:
            dt = self.source.dtype.newbyteorder("<")
            self.source = np.ascontiguousarray(self.source, dtype=dt)
        self.contiguous = True

    def copy_into(self, dst: memoryview) -> None:
        """Write the file's bytes for this tensor into ``dst`` (blocking; releases the GIL)."""
        if not self.nbytes:
            return
        if is_torch_tensor(self.source):
            torch = sys.modules["torch"]
            out = torch.frombuffer(dst, dtype=torch.uint8).view(self.source.dtype).view(self.shape)
            out.copy_(self.source)
            return
        le = self.source.dtype.newbyteorder("<")
        np.copyto(np.frombuffer(dst, dtype=np.uint8).view(le).reshape(self.shape), self.source)


def prepare(leaf: Leaf) -> SaveTensor:
    """Classify one leaf (cheap: no data is touched); ConfigError naming it if unsupported."""

    def where() -> str:  # only for an error: formatting every leaf's path was most of the cost
        return f"{path_text(leaf.path)} ({leaf.name!r})"

    value = leaf.value
    if is_dtensor(value):
        value = dtensor_box(value, where())
    if isinstance(value, Shard):
        if isinstance(value.data, Shard) or not is_array(value.data):
            raise ConfigError(f"{where()}: Shard data must be an array, got {type(value.data).__name__}")
        t = _prepare_data(value.data, leaf, where)
        t.box = check_box(value.global_shape, value.offsets, t.shape, where())
        return t
    return _prepare_data(value, leaf, where)


def _prepare_data(value: Any, leaf: Leaf, where: Callable[[], str]) -> SaveTensor:
    if is_torch_tensor(value):
        t = value.detach()
        if t.device.type != "cpu":
            raise ConfigError(f"{where()}: tensor is on {t.device}; move it to the CPU first")
        if t.layout is not sys.modules["torch"].strided:
            raise ConfigError(f"{where()}: {t.layout} tensors are not supported (dense tensors only)")
        dt = dtypes.from_torch(t.dtype, where)
        ok = t.is_contiguous() and not t.is_conj() and not t.is_neg()
        return SaveTensor(leaf, dt, tuple(t.shape), t.numel() * dt.itemsize, t, ok)
    if isinstance(value, np.ndarray | np.generic) or hasattr(value, "__array_interface__"):
        array = np.asarray(value)
    else:
        array = np.asarray(memoryview(value))  # the buffer protocol: its format gives the dtype
    dt = dtypes.from_numpy(array.dtype, where)
    little = array.dtype.byteorder in ("|", "<") or (array.dtype.byteorder == "=" and _LE == "<")
    ok = bool(array.flags.c_contiguous) and little
    return SaveTensor(leaf, dt, tuple(int(d) for d in array.shape), array.size * dt.itemsize, array, ok)


@dataclass
class Destination:
    """Where one tensor's bytes land on load, and what the caller gets back."""

    entry: TensorEntry
    result: Any  # the array/tensor handed back
    view: memoryview  # bytes to fill (the result's memory, or a temporary)
    finish: Any = None  # (target, temporary) when a non-contiguous target is filled via a copy

    def complete(self) -> None:
        """Copy a temporary into a non-contiguous target (blocking)."""
        if self.finish is None:
            return
        target, temp = self.finish
        if is_torch_tensor(target):
            target.copy_(temp)
        else:
            np.copyto(target, temp)


def numpy_kind(entry: TensorEntry, *, as_torch: bool, ml_dtypes: Any) -> np.dtype[Any] | None:
    """The NumPy dtype to load ``entry`` as, or None for torch (asked, or NumPy lacks it)."""
    if as_torch:
        return None
    found = dtypes.numpy_dtype(entry.dtype, ml_dtypes=ml_dtypes)
    if found is None and dtypes.optional_module("torch") is None:
        raise MissingDependencyError(
            "ml_dtypes",
            "mldtypes",
            f"tensor {entry.name!r} is {entry.dtype.code}, which NumPy lacks; loading it (or install "
            "torch: asyncckpt[torch])",
        )
    return found


def allocate(entry: TensorEntry, *, as_torch: bool, ml_dtypes: Any) -> Destination:
    kind = numpy_kind(entry, as_torch=as_torch, ml_dtypes=ml_dtypes)
    if kind is not None:
        array = np.empty(entry.shape, dtype=kind)
        return Destination(entry, array, _bytes_of(array))
    torch = dtypes.torch_module(f"loading tensor {entry.name!r} ({entry.dtype.code}) as a torch tensor")
    tensor = torch.empty(entry.shape, dtype=dtypes.torch_dtype(entry.dtype))
    return Destination(entry, tensor, _torch_bytes(tensor))


def bind(entry: TensorEntry, target: Any, where: str) -> Destination:
    """Use the caller's array as the destination; shapes and dtypes must match exactly."""
    if is_torch_tensor(target):
        t = target.detach()
        if t.device.type != "cpu":
            raise ConfigError(f"into: {where} is on {t.device}; in-place loads need CPU tensors")
        dt, shape = dtypes.from_torch(t.dtype, f"into: {where}"), tuple(t.shape)
    elif isinstance(target, np.ndarray):
        if not target.flags.writeable:
            raise ConfigError(f"into: {where} is a read-only array")
        dt, shape = dtypes.from_numpy(target.dtype, f"into: {where}"), tuple(target.shape)
    else:
        raise ConfigError(
            f"into: {where} is a {type(target).__name__}; in-place loads need arrays or tensors"
        )
    if dt != entry.dtype or shape != entry.shape:
        raise ConfigError(
            f"into: {where} is {dt.code}{list(shape)} but the checkpoint's tensor {entry.name!r} "
            f"is {entry.dtype.code}{list(entry.shape)}"
        )
    if is_torch_tensor(target):
        if t.is_contiguous():
            return Destination(entry, target, _torch_bytes(t))
        temp = t.contiguous()
        return Destination(entry, target, _torch_bytes(temp), (t, temp))
    little = target.dtype.byteorder in ("|", "<") or (target.dtype.byteorder == "=" and _LE == "<")
    if target.flags.c_contiguous and little:
        return Destination(entry, target, _bytes_of(target))
    temp = np.empty(entry.shape, dtype=target.dtype.newbyteorder("<"))
    return Destination(entry, target, _bytes_of(temp), (target, temp))


def byte_array(target: Any, where: str) -> np.ndarray[Any, Any]:
    """The bytes of a writable, C-contiguous, little-endian CPU array or tensor, as a 1-D uint8
    array sharing its memory (a resharded load fills part of it); ConfigError otherwise."""
    if is_torch_tensor(target):
        t = target.detach()
        if t.device.type != "cpu":
            raise ConfigError(f"{where} is on {t.device}; in-place loads need CPU tensors")
        if not t.is_contiguous():
            raise ConfigError(f"{where} is not contiguous; a resharded load fills contiguous tensors only")
        return np.frombuffer(_torch_bytes(t), np.uint8)
    if not isinstance(target, np.ndarray):
        raise ConfigError(f"{where} is a {type(target).__name__}; in-place loads need arrays or tensors")
    little = target.dtype.byteorder in ("|", "<") or (target.dtype.byteorder == "=" and _LE == "<")
    if not (target.flags.c_contiguous and target.flags.writeable and little):
        raise ConfigError(f"{where} must be a writable, C-contiguous, little-endian array")
    return target.reshape(-1).view(np.uint8)
