"""Issue 27 item 5: a step's objects and its Hugging Face index open with stock tools.

Two real ranks (torchrun, gloo) save a tiny Llama's weights (built from a config, nothing
downloaded) as one step, half each; the ``safetensors`` library, ``transformers`` and DCP's
``HuggingFaceStorageReader`` then read the step directory as it is.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

from safetensors import safe_open  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from asyncckpt.state.hf_index import INDEX, ObjectTensors, hf_index  # noqa: E402
from asyncckpt.state.index import INDEX as STEP_INDEX  # noqa: E402
from asyncckpt.steps import COMMIT  # noqa: E402

from .launch import torchrun  # noqa: E402

pytestmark = [
    pytest.mark.torchrun,
    pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning"),
]
OBJECTS = ("rank-0-of-2.safetensors", "rank-1-of-2.safetensors")


def tiny_llama() -> Any:
    config = LlamaConfig(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=32, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def raw(t: Any) -> bytes:
    return bytes(t.contiguous().view(-1).view(torch.uint8).numpy())


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any, dict[str, Any]]:
    """(step-1 directory, the model, its weights) after a 2-rank save."""
    root = tmp_path_factory.mktemp("hf")
    model = tiny_llama()
    weights = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    save_file(weights, str(root / "ref.safetensors"))
    proc = torchrun("tests.hf_child", str(root), timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return root / "run" / "step-1", model, weights


def test_the_index_maps_every_tensor_to_its_rank_object(saved: tuple[Path, Any, dict[str, Any]]) -> None:
    step, _, weights = saved
    assert (step / COMMIT).exists()
    index = json.loads((step / INDEX).read_text())
    names = sorted(weights)
    want = {name: OBJECTS[i % 2] for i, name in enumerate(names)}  # the child's split
    assert index == {"metadata": {"total_size": sum(t.nbytes for t in weights.values())}, "weight_map": want}


def test_safe_open_reads_each_object_through_the_index(saved: tuple[Path, Any, dict[str, Any]]) -> None:
    step, _, weights = saved
    weight_map: dict[str, str] = json.loads((step / INDEX).read_text())["weight_map"]
    seen = set()
    for name in sorted(set(weight_map.values())):
        with safe_open(str(step / name), framework="pt") as f:
            assert f.metadata()["format"] == "pt"  # transformers 4.x refuses a file without it
            keys = f.keys()
            assert set(keys) == {k for k, v in weight_map.items() if v == name}
            for key in keys:
                got = f.get_tensor(key)
                assert got.dtype == weights[key].dtype and got.shape == weights[key].shape, key
                assert raw(got) == raw(weights[key]), key
                seen.add(key)
    assert seen == set(weights)


def test_transformers_loads_the_step_as_a_sharded_checkpoint(
    saved: tuple[Path, Any, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    step, model, weights = saved
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model.config.save_pretrained(step)  # the model's config beside the weights, as on the Hub
    loaded = LlamaForCausalLM.from_pretrained(step, local_files_only=True).eval()
    state = loaded.state_dict()
    assert set(state) == set(weights)
    assert all(raw(state[k]) == raw(weights[k]) for k in weights)
    ids = torch.arange(12).reshape(2, 6)
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_dcp_huggingface_reader_loads_the_step(saved: tuple[Path, Any, dict[str, Any]]) -> None:
    """Nested keys: DCP flattens ``{"model": {"norm.weight": t}}`` to ``model.norm.weight``,
    as asyncckpt names the tensor."""
    step, _, weights = saved
    into: dict[str, dict[str, Any]] = {}
    for name, tensor in weights.items():
        head, _, rest = name.partition(".")
        into.setdefault(head, {})[rest] = torch.zeros_like(tensor)
    dcp.load(into, storage_reader=dcp.HuggingFaceStorageReader(str(step)))
    for name, tensor in weights.items():
        head, _, rest = name.partition(".")
        assert raw(into[head][rest]) == raw(tensor), name


def test_no_index_when_ranks_save_the_same_name(saved: tuple[Path, Any, dict[str, Any]]) -> None:
    """Step 2 was saved twice: first with distinct names (indexed), then with ``w`` on both
    ranks, which no HF index can place: the first save's HF index is gone, the step committed
    (asyncckpt's own step index stays: it places repeated names by rank)."""
    step2 = saved[0].parent / "step-2"
    assert (step2 / COMMIT).exists() and not (step2 / INDEX).exists()
    assert sorted(p.name for p in step2.iterdir()) == sorted([COMMIT, "OWNER.json", STEP_INDEX, *OBJECTS])


def test_hf_index_refuses_a_repeated_name_or_a_partial_tensor() -> None:
    whole = [ObjectTensors("a", ("x", "y"), 8), ObjectTensors("b", ("z",), 4)]
    assert hf_index(whole) == {"metadata": {"total_size": 12}, "weight_map": {"x": "a", "y": "a", "z": "b"}}
    assert hf_index([*whole, ObjectTensors("c", ("x",), 4)]) is None
    assert hf_index([*whole, ObjectTensors("c", None, 4)]) is None
    assert hf_index([]) == {"metadata": {"total_size": 0}, "weight_map": {}}
