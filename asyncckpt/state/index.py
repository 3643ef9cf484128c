"""A step's index: where every tensor of a multi-rank step lies, so any number of ranks can
load it (``asyncckpt-index.json``, written with the commit record).

Per global tensor (a sharded leaf: :class:`~asyncckpt.state.shard.Shard` or a ``DTensor``):
its dtype, global shape and the boxes that objects hold (object, offsets, shape, byte range);
per plain tensor: where each rank's own copy lies. Every rank builds the index from the
ranks' gathered layouts (so each rank raises the same error on inconsistent shards before
the step commits); rank 0 publishes it. ``version`` says how to read it: a reader refuses a
version it does not know, by name, rather than misreading it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError, StateFormatError

INDEX = "asyncckpt-index.json"
FORMAT = "asyncckpt.step-index"
VERSION = 1


@dataclass(frozen=True)
class Box:
    """One saved box of a tensor: ``shape`` elements from ``offsets``, at bytes
    ``[start, end)`` of object number ``obj``."""

    obj: int
    offsets: tuple[int, ...]
    shape: tuple[int, ...]
    start: int
    end: int


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str
    global_shape: tuple[int, ...]
    boxes: tuple[Box, ...]
    sharded: bool


@dataclass(frozen=True)
class StepIndex:
    world_size: int
    objects: tuple[str, ...]
    tensors: dict[str, Tensor]  # the sharded leaves
    local: tuple[dict[str, Tensor], ...]  # per object: its plain tensors (one whole box each)


def build(objects: Sequence[str], layouts: Sequence[Sequence[Mapping[str, Any]]]) -> dict[str, Any]:
    """The index record of a step from each rank's object layout (``StateSaveResult.layout``);
    ConfigError when the ranks' shards of a tensor disagree, overlap or do not tile it."""
    tensors: dict[str, dict[str, Any]] = {}
    local: list[dict[str, Any]] = []
    for obj, layout in enumerate(layouts):
        mine: dict[str, Any] = {}
        for e in layout:
            if "global_shape" not in e:
                mine[e["name"]] = {
                    "dtype": e["dtype"],
                    "shape": e["shape"],
                    "start": e["start"],
                    "end": e["end"],
                }
                continue
            t = tensors.setdefault(
                e["name"], {"dtype": e["dtype"], "global_shape": e["global_shape"], "boxes": []}
            )
            if (t["dtype"], t["global_shape"]) != (e["dtype"], e["global_shape"]):
                raise ConfigError(
                    f"sharded tensor {e['name']!r}: rank {obj} saved {e['dtype']}{e['global_shape']}, an "
                    f"earlier rank {t['dtype']}{t['global_shape']}: every rank must describe the same tensor"
                )
            box = {
                "object": obj,
                "offsets": e["offsets"],
                "shape": e["shape"],
                "start": e["start"],
                "end": e["end"],
            }
            same = any(b["offsets"] == box["offsets"] and b["shape"] == box["shape"] for b in t["boxes"])
            if math.prod(e["shape"]) and not same:  # empty boxes (replicas) and duplicates: skipped
                t["boxes"].append(box)
        local.append(mine)
    for name, t in tensors.items():
        _refuse_overlap(name, t)
        covered, whole = sum(math.prod(b["shape"]) for b in t["boxes"]), math.prod(t["global_shape"])
        if covered != whole:
            raise ConfigError(
                f"sharded tensor {name!r} {t['dtype']}{t['global_shape']}: the ranks' boxes hold {covered} "
                f"of its {whole} elements (boxes must tile the global shape)"
            )
    return {
        "format": FORMAT,
        "version": VERSION,
        "world_size": len(objects),
        "objects": list(objects),
        "tensors": tensors,
        "local": local,
    }


def _refuse_overlap(name: str, t: Mapping[str, Any]) -> None:
    """ConfigError naming two boxes of ``t`` that share elements (a load would take either
    rank's values for them, and the ones they leave out could still sum to the whole)."""
    boxes: list[Mapping[str, Any]] = t["boxes"]
    if len(boxes) < 2 or not t["global_shape"]:
        return
    # sweep along the dimension the boxes are split most in: only boxes whose ranges there
    # meet are compared (a row split compares neighbours only)
    dim = max(range(len(t["global_shape"])), key=lambda d: len({b["offsets"][d] for b in boxes}))
    order = sorted(boxes, key=lambda b: b["offsets"][dim])
    for i, a in enumerate(order):
        a_end = a["offsets"][dim] + a["shape"][dim]
        for b in order[i + 1 :]:
            if b["offsets"][dim] >= a_end:
                break
            if all(
                bo < ao + an and ao < bo + bn
                for ao, an, bo, bn in zip(a["offsets"], a["shape"], b["offsets"], b["shape"], strict=True)
            ):
                first, second = sorted((a, b), key=lambda x: int(x["object"]))
                raise ConfigError(
                    f"sharded tensor {name!r} {t['dtype']}{t['global_shape']}: rank {first['object']}'s box "
                    f"(offsets {first['offsets']}, shape {first['shape']}) and rank {second['object']}'s "
                    f"(offsets {second['offsets']}, shape {second['shape']}) overlap: each element must be "
                    "saved by one box (a replica saves an empty one)"
                )


def _ints(value: Any) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise ValueError(f"not a list of ints: {value!r:.60}")
    return tuple(value)


def parse(record: Mapping[str, Any], where: str) -> StepIndex:
    """A published index; StateFormatError naming the defect or the unknown version."""
    if record.get("format") != FORMAT:
        raise StateFormatError(f"{where}: not an asyncckpt step index (format {record.get('format')!r})")
    version = record.get("version")
    if version != VERSION:
        raise StateFormatError(
            f"{where}: step index version {version!r}; this asyncckpt reads version {VERSION} only "
            "(load the step with the asyncckpt that saved it, on the world size it was saved with)"
        )
    try:
        objects = tuple(str(o) for o in record["objects"])
        tensors = {
            name: Tensor(
                name,
                str(t["dtype"]),
                _ints(t["global_shape"]),
                tuple(
                    Box(
                        int(b["object"]),
                        _ints(b["offsets"]),
                        _ints(b["shape"]),
                        int(b["start"]),
                        int(b["end"]),
                    )
                    for b in t["boxes"]
                ),
                True,
            )
            for name, t in record["tensors"].items()
        }
        local = tuple(
            {
                name: Tensor(name, str(t["dtype"]), _ints(t["shape"]), (_whole(obj, t),), False)
                for name, t in mine.items()
            }
            for obj, mine in enumerate(record["local"])
        )
        world = int(record["world_size"])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise StateFormatError(f"{where}: the step index is malformed ({exc})") from None
    if len(objects) != world or len(local) != world:
        raise StateFormatError(f"{where}: the step index lists {len(objects)} objects for {world} ranks")
    return StepIndex(world, objects, tensors, local)


def _whole(obj: int, t: Mapping[str, Any]) -> Box:
    shape = _ints(t["shape"])
    return Box(obj, (0,) * len(shape), shape, int(t["start"]), int(t["end"]))
