"""Sharded steps on real ``torchrun`` ranks (gloo, CPU; ``tests/shard_child.py``): boxes that
overlap are refused at commit; a step restored on the ranks that saved it; DCP's
``HuggingFaceStorageReader`` reads a step of boxes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp

from asyncckpt.errors import ConfigError
from asyncckpt.state.index import build
from asyncckpt.steps import COMMIT

from .launch import torchrun
from .shard_child import A, C, N

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


def ok(proc: Any) -> None:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_overlapping_boxes_of_two_ranks_are_refused_and_the_step_not_committed(tmp_path: Path) -> None:
    """Before: the boxes [0, 2) and [1, 3) of a 4-element tensor hold 4 elements together,
    which was all the index checked: the step committed, element 1 saved twice and element 3
    never."""
    ok(torchrun("tests.shard_child", "overlap", str(tmp_path), nproc=2, timeout=120))
    for rank in (0, 1):
        text = (tmp_path / f"result-{rank}.txt").read_text()
        assert text.startswith(
            "ConfigError: sharded tensor 'x' F64[4]: rank 0's box (offsets [0], shape [2])"
        ), text
        assert "rank 1's (offsets [1], shape [2]) overlap" in text, text
    assert not (tmp_path / "run" / "step-1" / COMMIT).exists()


def layout(name: str, offsets: list[int], shape: list[int]) -> list[dict[str, Any]]:
    return [{"name": name, "dtype": "F32", "shape": shape, "global_shape": [4, 6], "offsets": offsets,
             "start": 0, "end": 4}]  # fmt: skip


@pytest.mark.parametrize(
    ("boxes", "refused"),
    [
        ([([0, 0], [2, 6]), ([2, 0], [2, 6])], False),  # rows
        ([([0, 0], [4, 3]), ([0, 3], [4, 3])], False),  # columns
        ([([0, 0], [2, 3]), ([0, 3], [2, 3]), ([2, 0], [2, 6]), ([0, 0], [2, 3])], False),  # a replica
        ([([0, 0], [3, 3]), ([2, 3], [2, 3]), ([0, 3], [2, 3]), ([3, 0], [1, 3])], False),
        ([([0, 0], [3, 4]), ([1, 2], [3, 4])], True),
        ([([0, 0], [2, 6]), ([1, 0], [1, 6]), ([3, 0], [1, 6])], True),  # sums to 24 with a hole
    ],
)
def test_the_index_tells_tiles_from_overlaps(boxes: list[tuple[list[int], list[int]]], refused: bool) -> None:
    layouts = [layout("w", o, s) for o, s in boxes]
    objects = [f"rank-{r}" for r in range(len(boxes))]
    if refused:
        with pytest.raises(ConfigError, match="overlap"):
            build(objects, layouts)
    else:
        assert len(json.dumps(build(objects, layouts))) > 0


def test_a_sharded_step_restored_on_the_ranks_that_saved_it(tmp_path: Path) -> None:
    """Before: into= DTensors gave rank 1 rank 0's plain tensor and values (``p``, ``rank``);
    into= whole tensors was a ConfigError (``c`` is I64[5], the object's box I64[0]);
    ``load_state`` into DTensors failed with torch's ``.numpy() is not supported for tensor
    subclasses``, and a Shard of the other rank's box was filled with this rank's values."""
    ok(torchrun("tests.shard_child", "restore", str(tmp_path), nproc=2, timeout=120))
    for rank in (0, 1):
        facts = json.loads((tmp_path / f"result-{rank}.json").read_text())
        assert facts["dtensor"] == {"p": [rank, rank], "rank": rank, "state_rank": rank}
        assert facts["whole"] == {"p": [rank, rank], "rank": rank}
        assert f"holds 'n' at offsets [{2 * rank}], shape [2] of [4]" in facts["other_box"]
        assert "is the box at offsets [" in facts["other_box"]
    assert json.loads((tmp_path / "result-0.json").read_text())["load_state"] == "ok"
    told = json.loads((tmp_path / "result-1.json").read_text())["load_state"]
    assert "state['c'] is the box at offsets [0], shape [5] of a [5] tensor" in told, told
    assert "holds 'c' at offsets [0], shape [0] of [5]: load the step with load_step" in told


def test_dcp_huggingface_reader_loads_a_step_of_boxes(tmp_path: Path) -> None:
    """Before: DCP's reader took each box for a whole tensor at offset 0: 'Size mismatch
    between saved torch.Size([2, 3]) and current: torch.Size([4, 3]) for a'. The step's
    objects now say where each box lies (``DCP_SHARDING_INFO``); on two ranks into DTensors,
    and here (one process) into whole tensors."""
    ok(torchrun("tests.shard_child", "hf", str(tmp_path), nproc=2, timeout=120))
    into = {"a": torch.zeros(4, 3), "b": torch.zeros(3, 4), "c": torch.zeros(5, dtype=torch.int64)}
    into["n"] = torch.zeros(4, dtype=torch.float64)
    dcp.load(into, storage_reader=dcp.HuggingFaceStorageReader(str(tmp_path / "run" / "step-1")))
    assert torch.equal(into["a"], A) and torch.equal(into["b"], A.T) and torch.equal(into["c"], C)
    assert torch.equal(into["n"], torch.from_numpy(N))
