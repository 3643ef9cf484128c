"""Sharded leaves: one rank's box of a global tensor.

:class:`Shard` is the explicit form, for NumPy arrays and plain torch tensors: the global
shape and where this rank's local array sits in it. A torch ``DTensor`` is turned into one
(its local tensor, its global shape and its box from the mesh and placements). Each rank
writes only its box; a box that another rank also holds (a ``Replicate`` mesh dimension) is
written by the rank at coordinate 0 of that dimension only, the others write an empty box.
"""

from __future__ import annotations

import json
import math
import numbers
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError, StateFormatError

#: header metadata of a state object: ``{name: [global shape, offsets]}`` of its sharded leaves
K_SHARDS = "asyncckpt.shards"
#: header metadata torch DCP's ``HuggingFaceStorageReader`` places a file's tensors by:
#: ``{name: {"saved_offsets": offsets}}`` for every tensor of the file
DCP_SHARDING_INFO = "DCP_SHARDING_INFO"


@dataclass(frozen=True)
class Shard:
    """This rank's box of a global tensor: ``data`` (a NumPy array or CPU torch tensor)
    holds the elements ``[offsets[d], offsets[d] + data.shape[d])`` of each dimension ``d``
    of a tensor of ``global_shape``."""

    global_shape: tuple[int, ...]
    offsets: tuple[int, ...]
    data: Any

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(int(d) for d in self.data.shape)


def _ints(value: object) -> tuple[int, ...] | None:
    """``value`` as a tuple of non-negative ints (Python's or NumPy's: ``np.int64`` from an
    array's shape or a ``np.cumsum`` of split sizes), None if it is not one."""
    if not isinstance(value, (tuple, list)):
        return None
    if not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in value):
        return None
    out = tuple(int(v) for v in value)
    return out if all(v >= 0 for v in out) else None


def check_box(
    global_shape: object, offsets: object, shape: tuple[int, ...], where: str
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(global shape, offsets) validated against the local ``shape``; ConfigError naming it."""
    g, o = _ints(global_shape), _ints(offsets)
    if g is None or o is None:
        raise ConfigError(
            f"{where}: Shard global_shape and offsets must be tuples of non-negative ints, "
            f"got {global_shape!r} and {offsets!r}"
        )
    if not len(g) == len(o) == len(shape):
        raise ConfigError(
            f"{where}: Shard of a {len(g)}-d global shape {list(g)} with {len(o)} offsets holds "
            f"a {len(shape)}-d array"
        )
    for d, (gd, od, sd) in enumerate(zip(g, o, shape, strict=True)):
        if od + sd > gd:
            raise ConfigError(
                f"{where}: Shard box {list(o)} + {list(shape)} leaves the global shape {list(g)} "
                f"in dimension {d}"
            )
    return g, o


def is_dtensor(value: object) -> bool:
    """A torch ``DTensor`` (never imports torch: a DTensor implies it is loaded)."""
    module = sys.modules.get("torch.distributed.tensor")
    kind = getattr(module, "DTensor", None)
    return kind is not None and isinstance(value, kind)


def dtensor_box(value: Any, where: str) -> Shard:
    """The box a DTensor's local tensor holds; ConfigError for what cannot be saved yet."""
    placements = tuple(value.placements)
    for p in placements:
        if p.is_partial():
            raise ConfigError(
                f"{where}: DTensor with a Partial placement ({p}) holds partial sums, not a box of "
                "the tensor; reduce it (redistribute to Shard or Replicate) before saving"
            )
    local = value.to_local()
    if local.device.type != "cpu":
        raise ConfigError(
            f"{where}: DTensor on {local.device}: asyncckpt has no device path yet; "
            "move it to a CPU mesh first"
        )
    mesh = value.device_mesh
    coords = mesh.get_coordinate()
    utils = sys.modules.get("torch.distributed.tensor._utils")
    if utils is None:  # pragma: no cover - loaded with torch.distributed.tensor
        raise ConfigError(f"{where}: torch.distributed.tensor._utils is not loaded")
    shape, offsets = utils.compute_local_shape_and_global_offset(value.shape, mesh, placements)
    replica = coords is not None and any(
        p.is_replicate() and coords[d] != 0 for d, p in enumerate(placements)
    )
    if replica and len(shape):  # written once, by coordinate 0 of each Replicate dimension
        local = local.reshape(-1)[:0].reshape((0,) * len(shape))  # an empty box here
        offsets = (0,) * len(shape)
    return Shard(tuple(int(d) for d in value.shape), tuple(int(o) for o in offsets), local)


def dest_box(value: object) -> Shard | None:
    """The box an ``into=`` leaf stands for: a DTensor's local tensor where its mesh places
    it (a replica's box is its whole copy), a :class:`Shard` as it is; None for anything else."""
    if isinstance(value, Shard):
        return value
    if not is_dtensor(value):
        return None
    utils = sys.modules["torch.distributed.tensor._utils"]  # loaded with torch.distributed.tensor
    d: Any = value
    _, offsets = utils.compute_local_shape_and_global_offset(d.shape, d.device_mesh, d.placements)
    return Shard(tuple(int(n) for n in d.shape), tuple(int(o) for o in offsets), d.to_local())


Box = tuple[tuple[int, ...], tuple[int, ...]]


def dcp_sharding_info(tensors: Sequence[tuple[str, tuple[int, ...], Box | None]]) -> str:
    """``DCP_SHARDING_INFO`` of an object's tensors (name, local shape, box or None): where
    each lies in its global tensor, as DCP's ``HuggingFaceStorageReader`` reads it (it takes a
    tensor's global shape as the largest box end). An empty box (a replica's) is placed at the
    tensor's end: at its offsets it would take the place of the box that holds the elements
    (DCP keys a file's piece by name and offsets)."""
    out: dict[str, dict[str, list[int]]] = {}
    for name, shape, box in tensors:
        if box is None:
            offsets: Sequence[int] = (0,) * len(shape)
        elif math.prod(shape) == 0:
            offsets = box[0]
        else:
            offsets = box[1]
        out[name] = {"saved_offsets": list(offsets)}
    return json.dumps(out, separators=(",", ":"))


def encode_boxes(boxes: Mapping[str, Box]) -> str:
    return json.dumps({name: [list(g), list(o)] for name, (g, o) in boxes.items()}, separators=(",", ":"))


def decode_boxes(meta: Mapping[str, str], where: str) -> dict[str, Box]:
    """The sharded leaves an object's header names (empty when it has none)."""
    text = meta.get(K_SHARDS)
    if text is None:
        return {}
    try:
        raw = json.loads(text)
        out = {str(n): (tuple(int(x) for x in g), tuple(int(x) for x in o)) for n, (g, o) in raw.items()}
    except (ValueError, TypeError, AttributeError) as exc:
        raise StateFormatError(f"{where}: {K_SHARDS} is malformed ({exc})") from None
    return out
