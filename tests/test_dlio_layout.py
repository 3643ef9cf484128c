"""DLIO's checkpoint layout (dlio_benchmark d120d8a5), --plan, presets and Hydra overrides.

Expected objects and sizes are written out here from the formulas, independently of
asyncckpt.bench.dlio_layout, for small worlds of the real MLPerf Storage shapes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from asyncckpt.bench.cli import build_parser, main
from asyncckpt.bench.dlio import load_workload, parse_workload
from asyncckpt.bench.dlio_layout import DLIO_GB, DlioModel, plan_checkpoint
from asyncckpt.bench.overrides import apply_overrides, parse_override, split_overrides
from asyncckpt.bench.presets import PRESETS
from asyncckpt.bench.scaleout import parse_with_presets
from asyncckpt.errors import ConfigError

FIXTURES = Path(__file__).parent / "fixtures" / "dlio"
FILES = {
    "llama3-8b": "llama3_8b.yaml",
    "llama3-70b": "llama3_70b.yaml",
    "llama3-405b": "llama3_405b.yaml",
    "llama3-1t": "llama3_1t.yaml",
}


def model_of(name: str) -> DlioModel:
    m = load_workload(FIXTURES / FILES[name]).model
    assert m is not None
    return m


def params(h: int, layers: int, ffn: int, vocab: int, heads: int, kv_heads: int) -> int:
    kv = h // heads * kv_heads
    layer = h + h * (h + 2 * kv) + h * h + h + 2 * h * ffn + h * ffn
    return 2 * vocab * h + layers * layer + h


def names(plan_rank: object) -> list[tuple[str, int]]:
    return [(o.name, o.size) for o in plan_rank.objects]  # type: ignore[attr-defined]


def test_8b_on_8_ranks_zero3_shards_model_and_optimizer_over_data_parallelism() -> None:
    h, ffn, v, dp = 4096, 14336, 128256, 8
    kv = 4096 // 32 * 8
    layer = [h // dp, h * (h + 2 * kv) // dp, h * h // dp, h // dp, h * 2 * ffn // dp, h * ffn // dp]
    model_bytes = 2 * (2 * (h * v // dp) + 32 * sum(layer) + h // dp)  # layers 0..34, fp16
    p = params(h, 32, ffn, v, 32, 8)
    assert p == 8_030_261_248
    optim_bytes = 4 * (3 * (p // 8) + 3 * 5 * h)  # fp32, three (params, 5h) groups
    plan = plan_checkpoint(model_of("llama3-8b"), 8)
    assert not plan.subset and plan.data_parallelism == 8
    for r in range(8):
        assert names(plan.rank_plans[r]) == [
            (f"zero_pp_rank_{r}_mp_rank_0_model_states.pt", model_bytes),
            (f"zero_pp_rank_{r}_mp_rank_0_optim_states.pt", optim_bytes),
        ]
    assert plan.total_bytes == 8 * (model_bytes + optim_bytes)
    assert plan.imbalance == 1.0


def test_405b_shape_on_tensor8_pipeline4_writes_per_layer_files_by_stage() -> None:
    h, ffn, v, tp = 16384, 53248, 128256, 8
    kv = 16384 // 128 * 8
    m = model_of("llama3-405b")
    m = DlioModel(**{**m.to_dict(), "pipeline": 4})
    plan = plan_checkpoint(m, 32)  # tensor 8 x pipeline 4, data 1, ZeRO 1
    edge = 2 * (h * v // tp)  # embedding / lm_head, split by tensor parallelism only (ZeRO 1)
    block = 2 * (h + h * (h + 2 * kv) // tp + h * h // tp + h + h * 2 * ffn // tp + h * ffn // tp)
    norm = 2 * h

    def size(layer: int) -> int:
        return edge if layer in (0, 127) else norm if layer == 128 else block

    # 126 layers over 4 stages: 32, 32, 31, 31; stage 0 adds the embedding, the last lm_head + norm
    stages = {0: range(0, 33), 1: range(33, 65), 2: range(65, 96), 3: range(96, 129)}
    optim = 4 * (3 * (params(h, 126, ffn, v, 128, 8) // 32) + 3 * 5 * h)
    for r in range(32):
        expect = [(f"layer_{i}-model_{r}_model_states.pt", size(i)) for i in stages[r // 8]]
        expect.append((f"zero_pp_rank_0_mp_rank_{r}_optim_states.pt", optim))
        assert names(plan.rank_plans[r]) == expect, r
    sizes = [rp.nbytes for rp in plan.rank_plans]
    assert plan.largest().nbytes == max(sizes)
    assert plan.imbalance == pytest.approx(max(sizes) / (sum(sizes) / 32))


def test_zero1_data_parallel_ranks_above_zero_write_only_optimizer_states() -> None:
    m = DlioModel(type="transformer", num_layers=4, tensor=2, pipeline=2, zero_stage=1, hidden_size=64,
                  ffn_hidden_size=128, vocab_size=100, num_attention_heads=4, num_kv_heads=2)  # fmt: skip
    plan = plan_checkpoint(m, 8)  # data 2
    for rp in plan.rank_plans[4:]:
        assert [o.kind for o in rp.objects] == ["optimizer"]
        assert rp.objects[0].name == f"zero_pp_rank_1_mp_rank_{rp.rank - 4}_optim_states.pt"
    zero0 = plan_checkpoint(DlioModel(**{**m.to_dict(), "zero_stage": 0, "pipeline": 1}), 8)
    assert [len(rp.objects) for rp in zero0.rank_plans] == [2, 2, 0, 0, 0, 0, 0, 0]  # only mp group 0


@pytest.mark.parametrize(
    ("fields", "ranks", "match"),
    [
        ({"num_layers": 2, "pipeline": 4}, 4, "num_layers 2 must be at least"),
        ({"num_layers": 8, "pipeline": 2, "zero_stage": 3}, 2, "ZeRO stage 3 is not compatible"),
        ({"num_layers": 8, "tensor": 4}, 6, "not a multiple of tensor 4"),
        ({"num_layers": 8, "data": 2, "tensor": 2}, 5, "more than the workload's"),
        ({"num_layers": 8, "model_datatype": "fp8"}, 1, "model_datatype must be one of"),
    ],
)
def test_dlio_validation_rules(fields: dict[str, int | str], ranks: int, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        plan_checkpoint(DlioModel(type="transformer", **fields), ranks)  # type: ignore[arg-type]


#: --plan totals at MLPerf Storage's rank counts (recorded in docs/scaleout.md)
PLAN_TOTALS = {
    "llama3-8b": (8, 112_425_623_552, 105),
    "llama3-70b": (64, 978_406_572_032, 912),
    "llama3-405b": (512, 5_682_508_791_808, 5290),
    "llama3-1t": (1024, 16_564_174_094_592, 18000),
}


@pytest.mark.parametrize("name", sorted(PLAN_TOTALS))
def test_plan_totals_of_the_four_workload_files(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    ranks, total, published = PLAN_TOTALS[name]
    assert main(["--plan", "--config", str(FIXTURES / FILES[name]), "--ranks", str(ranks)]) == 0
    out = capsys.readouterr().out
    assert f"total: {total:,} B" in out and f"this plan: {ranks} rank(s) (full run)" in out
    assert PRESETS[name].checkpoint_bytes == total  # the preset is the same workload
    gib = total / DLIO_GB
    if name == "llama3-1t":  # MLPerf's 18,000 = this total + 1/6 of it (docs/scaleout.md)
        assert gib * 7 / 6 == pytest.approx(published, rel=5e-3)  # published sizes are rounded
    else:
        assert gib == pytest.approx(published, rel=5e-3)  # published sizes are rounded


def test_presets_are_the_workload_files_and_plan_without_writing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name, file in FILES.items():
        assert yaml.safe_load((FIXTURES / file).read_text()) == PRESETS[name].workload
    out = tmp_path / "plan.json"
    target = tmp_path / "nothing-here"
    assert main([str(target), "--plan", "--model", "llama3-405b", "--ranks", "8", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "this plan: 8 rank(s) of 512" in text and "subset: 8 of the workload's 512 ranks" in text
    assert not target.exists()  # --plan writes nothing
    doc = json.loads(out.read_text())
    assert doc["subset"] and doc["full_ranks"] == 512 and len(doc["per_rank"]) == 8
    assert doc["dlio_commit"].startswith("d120d8a5")


def test_real_workload_file_is_read_and_unknown_keys_still_warn(tmp_path: Path) -> None:
    wl = load_workload(FIXTURES / "llama3_405b.yaml")
    assert wl.model is not None and wl.model.pipeline == 32 and wl.time_between_checkpoints == 5
    assert not any(u.startswith("model") for u in wl.unused + wl.unknown)
    assert wl.defaults["target"] == "checkpoints/llama_405b" and wl.defaults["no_fsync"] is False
    doc = yaml.safe_load((FIXTURES / "llama3_8b.yaml").read_text())
    doc["model"]["transformer"]["rope_theta"] = 5e5
    doc["checkpoint"]["turbo"] = True
    wl = parse_workload(doc, "w.yaml")
    assert wl.unknown == ["model.transformer.rope_theta", "checkpoint.turbo"]
    assert "unknown keys ignored: model.transformer.rope_theta, checkpoint.turbo" in wl.warnings()[0]
    with pytest.raises(ConfigError, match="legacy layout"):
        parse_workload({"model": {"num_layers": 2, "layer_parameters": [1]}, "checkpoint": {}})


def test_overrides_follow_hydra_add_and_force() -> None:
    rest, found, ignored = split_overrides(
        [
            "/x",
            "++workload.checkpoint.num_checkpoints_write=1",
            "+workload.model.parallelism.data=2",
            "++hydra.run.dir=out",
            "--plan",
        ]
    )
    assert rest == ["/x", "--plan"] and ignored == ["++hydra.run.dir=out"]
    doc = {"checkpoint": {"num_checkpoints_write": 10}, "model": {"parallelism": {"tensor": 8}}}
    new = apply_overrides(doc, found)
    assert new == {
        "checkpoint": {"num_checkpoints_write": 1},
        "model": {"parallelism": {"tensor": 8, "data": 2}},
    }
    assert doc["checkpoint"]["num_checkpoints_write"] == 10  # the input is not changed
    with pytest.raises(ConfigError, match="already set to 10; use \\+\\+"):
        apply_overrides(doc, [parse_override("+workload.checkpoint.num_checkpoints_write=1")])  # type: ignore[list-item]
    with pytest.raises(ConfigError, match=r"keys start with 'workload\.'"):
        parse_override("++checkpoint.fsync=false")
    with pytest.raises(ConfigError, match="expected \\+key=value"):
        parse_override("++workload..x=1")
    o = parse_override("++workload.checkpoint.fsync=false")
    assert o is not None and o.value is False and o.path == ("checkpoint", "fsync")


def test_overrides_reach_the_workload_and_the_arguments() -> None:
    args, info = parse_with_presets(
        build_parser(),
        ["--model", "llama3-405b", "++workload.checkpoint.num_checkpoints_write=2",
         "++workload.checkpoint.time_between_checkpoints=0", "++workload.model.parallelism.pipeline=16"],
    )  # fmt: skip
    assert info.workload is not None and info.workload.model is not None
    assert info.workload.model.pipeline == 16 and info.workload.time_between_checkpoints == 0
    assert args.repeat == 2 and args.target is None  # a preset writes to TARGET
    assert info.overrides[0] == "++workload.checkpoint.num_checkpoints_write=2"
    with pytest.raises(ConfigError, match="applies to a workload"):
        parse_with_presets(build_parser(), ["++workload.checkpoint.fsync=false"])
    with pytest.raises(ConfigError, match="--plan/--ranks need a workload"):
        parse_with_presets(build_parser(), ["--plan"])


@pytest.mark.parametrize("name", sorted(PLAN_TOTALS))
def test_a_workload_file_and_its_preset_plan_the_same_ranks(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--config llama3_8b.yaml`` is ``--model llama3-8b``: MLPerf Storage's full run, both ways."""
    by_file, by_preset = tmp_path / "file.json", tmp_path / "preset.json"
    assert main(["--plan", "--config", str(FIXTURES / FILES[name]), "--json", str(by_file)]) == 0
    err = capsys.readouterr().err
    assert main(["--plan", "--model", name, "--json", str(by_preset)]) == 0
    a, b = json.loads(by_file.read_text()), json.loads(by_preset.read_text())
    ranks = PLAN_TOTALS[name][0]
    assert a["ranks"] == b["ranks"] == a["full_ranks"] == b["full_ranks"] == ranks
    assert a["total_bytes"] == b["total_bytes"] == PLAN_TOTALS[name][1]
    assert f"{ranks} ranks: MLPerf Storage's full run of {name}" in err  # says where the count came from
