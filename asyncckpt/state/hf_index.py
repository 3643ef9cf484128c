"""The Hugging Face index of a step: ``model.safetensors.index.json`` beside its objects.

Hugging Face tools open a checkpoint split over several safetensors files through this index
(``transformers``' ``from_pretrained(dir)``, ``huggingface_hub``, ``accelerate``):
``{"metadata": {"total_size": N}, "weight_map": {tensor name: file}}``, ``N`` being the bytes
of every tensor. They take the file names from the ``weight_map``, so a step's own names
(``rank-<r>-of-<w>.safetensors``) serve as they are; ``model-00001-of-00002.safetensors`` is
only the name ``save_pretrained`` happens to choose.

A tensor name is its key path joined with ``.`` (``{"model": {"fc": {"weight": w}}}`` is
``model.fc.weight``), which is what ``transformers`` expects when the state saved is
``model.state_dict()`` itself. An index can only say where a name is when every name is in
exactly one object: when two ranks save the same name (each a replica of the same weights, or
each its own values under one key), or a rank holds only part of a tensor, the step has no
index, rather than one that silently picks a rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

INDEX = "model.safetensors.index.json"
#: the ``__metadata__`` a step's objects carry for Hugging Face tools: ``transformers`` 4.x
#: refuses a safetensors file whose metadata has no ``format`` of pt, tf, flax or mlx (the file
#: layout is the same whatever the framework; 5.x no longer checks)
HF_METADATA = {"format": "pt"}


@dataclass(frozen=True)
class ObjectTensors:
    """What one rank's object holds, as far as an index needs: its name, whole tensors' names
    and their bytes; ``names`` is None when the object holds part of a tensor."""

    object: str
    names: tuple[str, ...] | None
    tensor_bytes: int


def hf_index(objects: Sequence[ObjectTensors]) -> dict[str, Any] | None:
    """The index over a step's objects, or None when some name is not in exactly one whole
    object (see the module docstring)."""
    weight_map: dict[str, str] = {}
    for entry in objects:
        if entry.names is None:
            return None
        for name in entry.names:
            if name in weight_map:
                return None
            weight_map[name] = entry.object
    total = sum(entry.tensor_bytes for entry in objects)
    return {"metadata": {"total_size": total}, "weight_map": weight_map}
