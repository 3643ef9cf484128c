"""Element types: safetensors dtype codes ↔ NumPy, ``ml_dtypes`` and PyTorch dtypes.

NumPy lacks bfloat16 and the float8 types; they come from ``ml_dtypes`` (which extends
NumPy) or from torch. Both are optional and imported lazily through ``importlib`` (as
``Any``): importing torch costs a second and mypy must not analyse it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ConfigError, MissingDependencyError


@dataclass(frozen=True)
class DType:
    """One safetensors dtype: its code, element size and names in each library."""

    code: str
    itemsize: int
    numpy: str | None  # a dtype NumPy has natively
    ml_dtypes: str | None  # an ml_dtypes type name, for those NumPy lacks
    torch: str  # attribute of the torch module


TABLE: tuple[DType, ...] = (
    DType("BOOL", 1, "bool", None, "bool"),
    DType("U8", 1, "uint8", None, "uint8"),
    DType("I8", 1, "int8", None, "int8"),
    DType("I16", 2, "int16", None, "int16"),
    DType("U16", 2, "uint16", None, "uint16"),
    DType("I32", 4, "int32", None, "int32"),
    DType("U32", 4, "uint32", None, "uint32"),
    DType("I64", 8, "int64", None, "int64"),
    DType("U64", 8, "uint64", None, "uint64"),
    DType("F16", 2, "float16", None, "float16"),
    DType("F32", 4, "float32", None, "float32"),
    DType("F64", 8, "float64", None, "float64"),
    DType("C64", 8, "complex64", None, "complex64"),
    DType("BF16", 2, None, "bfloat16", "bfloat16"),
    DType("F8_E4M3", 1, None, "float8_e4m3fn", "float8_e4m3fn"),
    DType("F8_E5M2", 1, None, "float8_e5m2", "float8_e5m2"),
    DType("F8_E4M3FNUZ", 1, None, "float8_e4m3fnuz", "float8_e4m3fnuz"),
    DType("F8_E5M2FNUZ", 1, None, "float8_e5m2fnuz", "float8_e5m2fnuz"),
)
BY_CODE = {d.code: d for d in TABLE}
_BY_NUMPY = {name: d for d in TABLE for name in (d.numpy, d.ml_dtypes) if name}
_BY_TORCH = {f"torch.{d.torch}": d for d in TABLE}


def optional_module(name: str) -> Any | None:
    """The module if it is installed, else None."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def torch_module(purpose: str) -> Any:
    """``torch``, or MissingDependencyError naming the extra."""
    torch = optional_module("torch")
    if torch is None:
        raise MissingDependencyError("torch", "torch", purpose)
    return torch


#: what an error names: the text, or a function making it (a save classifies every tensor, and
#: formatting each one's path cost more than the rest of the classification)
Where = str | Callable[[], str]
#: dtype objects seen → DType (``dtype.name`` and ``str(dtype)`` cost microseconds per tensor);
#: one table per library, as a NumPy dtype compares equal to anything it can be made from
_SEEN_NUMPY: dict[np.dtype[Any], DType] = {}
_SEEN_TORCH: dict[object, DType] = {}


def _text(where: Where) -> str:
    return where if isinstance(where, str) else where()


def from_numpy(dtype: np.dtype[Any], where: Where) -> DType:
    """The safetensors dtype of a NumPy (or ml_dtypes) dtype; ConfigError naming ``where``."""
    found = _SEEN_NUMPY.get(dtype) or _BY_NUMPY.get(dtype.name)
    if found is None:
        raise ConfigError(
            f"{_text(where)}: dtype {dtype} has no safetensors equivalent "
            f"(supported: {', '.join(sorted(_BY_NUMPY))})"
        )
    _SEEN_NUMPY[dtype] = found
    return found


def from_torch(dtype: object, where: Where) -> DType:
    found = _SEEN_TORCH.get(dtype) or _BY_TORCH.get(str(dtype))
    if found is None:
        raise ConfigError(f"{_text(where)}: torch dtype {dtype} has no safetensors equivalent")
    _SEEN_TORCH[dtype] = found
    return found


def lookup(code: object, where: str) -> DType:
    """A dtype code read from a header; the error names it and ``where``."""
    found = BY_CODE.get(code) if isinstance(code, str) else None
    if found is None:
        raise ConfigError(f"{where}: unknown dtype {code!r} (this reader knows {', '.join(BY_CODE)})")
    return found


def numpy_dtype(d: DType, *, ml_dtypes: Any | None = None) -> np.dtype[Any] | None:
    """NumPy dtype for ``d``: native, else from ``ml_dtypes`` when given, else None."""
    if d.numpy is not None:
        return np.dtype(d.numpy)
    if ml_dtypes is not None and d.ml_dtypes is not None and hasattr(ml_dtypes, d.ml_dtypes):
        found: np.dtype[Any] = np.dtype(getattr(ml_dtypes, d.ml_dtypes))
        return found
    return None


def torch_dtype(d: DType) -> Any:
    torch = torch_module(f"loading {d.code} tensors as torch tensors")
    value = getattr(torch, d.torch, None)
    if value is None:
        raise MissingDependencyError("torch", "torch", f"dtype {d.code} (this torch has no torch.{d.torch})")
    return value
