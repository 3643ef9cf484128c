"""Saves and loads report each in their own words: ``SaveResult`` / ``LoadResult``, the old load
names as warning aliases, both kinds in the schema, and result files of schema 1.x still read."""

from __future__ import annotations

import asyncio
import copy
import json
import warnings
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from asyncckpt import AsyncCheckpointer, LoadResult, ReadRecord, SaveResult
from asyncckpt.bench.aggregate import aggregate_checkpoint
from asyncckpt.bench.outputs import render_text
from asyncckpt.bench.resultfiles import load_result, to_csv
from asyncckpt.results.metrics import busy_time
from asyncckpt.results.records import result_from_dict
from asyncckpt.results.schema import SCHEMA_VERSION, load_schema
from asyncckpt.units import KiB

from .conftest import run_bench
from .result_schema import assert_valid

CHUNK = 64 * KiB
SIZE = 5 * CHUNK + 123
V1_FILE = Path(__file__).parent / "fixtures" / "results" / "v1.0-single.json"
#: old name → new name, on LoadResult and on ReadRecord
RESULT_ALIASES = {
    "gen_s": "consume_s",
    "write_s": "read_s",
    "write_latency_s": "read_latency_s",
    "gen_bps": "consume_bps",
    "gen_io_ratio": "consume_io_ratio",
}
RECORD_ALIASES = {"fill_s": "consume_s", "write_s": "read_s", "t_write_start": "t_read_start"}
RECORD_ALIASES["t_write_end"] = "t_read_end"


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory) -> tuple[SaveResult, LoadResult]:
    target = tmp_path_factory.mktemp("kinds") / "ck.bin"

    async def run() -> tuple[SaveResult, LoadResult]:
        async with AsyncCheckpointer(chunk_size=CHUNK, num_buffers=3, seed=3) as ckpt:
            saved = await ckpt.save(target, SIZE)
            return saved, await ckpt.load(target, num_readers=2)

    return asyncio.run(run())


def test_a_load_returns_read_fields_that_add_up(both: tuple[SaveResult, LoadResult]) -> None:
    saved, loaded = both
    assert type(saved) is SaveResult and type(loaded) is LoadResult
    assert (saved.operation, loaded.operation) == ("save", "load")
    recs = loaded.records
    assert all(type(r) is ReadRecord for r in recs) and loaded.chunks == len(recs) == 6
    assert [r.offset for r in recs] == [i * CHUNK for i in range(6)]
    assert sum(r.nbytes for r in recs) == loaded.size_bytes == SIZE
    for r in recs:
        assert r.t_acquire <= r.t_read_start <= r.t_read_end
        assert r.read_s == pytest.approx(r.t_read_end - r.t_read_start)
        assert 0 < r.verify_s <= r.consume_s  # verification is part of the consumer's time
    assert loaded.read_s == busy_time([(r.t_read_start, r.t_read_end) for r in recs])
    assert 0 < loaded.read_s <= loaded.wall_s
    assert loaded.read_latency_s.max == max(r.read_s for r in recs)
    assert loaded.consume_s == sum(r.consume_s for r in recs)
    assert loaded.verify_s == sum(r.verify_s for r in recs)
    assert loaded.read_bps == SIZE / loaded.read_s
    assert loaded.io_s == loaded.read_s + loaded.close_s
    data = loaded.to_dict(include_records=True)
    assert {"read_s", "read_latency_s", "consume_s", "read_bps"} <= data.keys()
    assert not {"write_s", "write_latency_s", "gen_s", "gen_bps", "checksum_s"} & data.keys()
    assert {"t_read_start", "read_s", "consume_s"} <= data["records"][0].keys()


@pytest.mark.parametrize(("old", "new"), RESULT_ALIASES.items())
def test_old_load_names_warn_and_answer(both: tuple[SaveResult, LoadResult], old: str, new: str) -> None:
    loaded = both[1]
    with pytest.warns(DeprecationWarning, match=rf"LoadResult\.{old} is deprecated.*use {new}"):
        value = getattr(loaded, old)
    assert value == getattr(loaded, new)
    with pytest.raises(AttributeError):
        setattr(loaded, old, 1.0)


@pytest.mark.parametrize(("old", "new"), RECORD_ALIASES.items())
def test_old_record_names_warn_and_answer(both: tuple[SaveResult, LoadResult], old: str, new: str) -> None:
    rec = both[1].records[0]
    with pytest.warns(DeprecationWarning, match=rf"ReadRecord\.{old} is deprecated.*use {new}"):
        value = getattr(rec, old)
    assert value == getattr(rec, new)
    with pytest.raises(AttributeError, match="read-only"):
        setattr(rec, old, 1.0)


def test_new_names_do_not_warn(both: tuple[SaveResult, LoadResult]) -> None:
    saved, loaded = both
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        str(saved), str(loaded)  # the report uses only current names
        loaded.to_dict(include_records=True), saved.write_s, saved.gen_s


def _doc(*results: SaveResult | LoadResult) -> dict[str, Any]:
    """A result file as the bench writes it (through JSON: tuples become lists)."""
    doc = {
        "schema_version": SCHEMA_VERSION,
        "mode": "single",
        "size_bytes": SIZE,
        "target": "x",
        "summary": {},
        "results": [r.to_dict(include_records=True) for r in results],
    }
    loaded: dict[str, Any] = json.loads(json.dumps(doc))
    return loaded


def test_schema_describes_each_kind(both: tuple[SaveResult, LoadResult]) -> None:
    doc = _doc(*both)
    assert_valid(doc)
    for mutate in (
        lambda d: d["results"][1].update(write_s=0.1),  # a load does not write
        lambda d: d["results"][1].pop("read_latency_s"),
        lambda d: d["results"][1]["records"][0].update(fill_s=0.1),
        lambda d: d["results"][0].update(read_s=0.1),  # a save does not read
        lambda d: d["results"][0]["records"][0].pop("t_write_end"),
        lambda d: d["results"][1].update(method="preallocate"),
    ):
        bad = copy.deepcopy(doc)
        mutate(bad)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, load_schema())


def test_round_trip_keeps_the_kind(both: tuple[SaveResult, LoadResult]) -> None:
    for result in both:
        back = result_from_dict(json.loads(json.dumps(result.to_dict(include_records=True))))
        assert back == result


def test_aggregate_takes_both_kinds(both: tuple[SaveResult, LoadResult]) -> None:
    for result in both:
        agg = aggregate_checkpoint([result.to_dict(), result.to_dict()])
        assert agg["total_bytes"] == 2 * SIZE and agg["rank_bottlenecks"] == {result.bottleneck: 2}


def test_a_schema_1_file_is_upgraded_as_it_is_read() -> None:
    raw = json.loads(V1_FILE.read_text())
    assert raw["schema_version"] == "1.0"
    doc = load_result(V1_FILE)
    assert_valid(doc)
    old_load, load = raw["results"][2], doc["results"][2]
    assert (load["read_s"], load["consume_s"], load["read_latency_s"]) == (
        old_load["write_s"],
        old_load["gen_s"],
        old_load["write_latency_s"],
    )
    assert load["read_bps"] == old_load["size_bytes"] / old_load["write_s"]
    assert load["records"][0]["t_read_end"] == old_load["records"][0]["t_write_end"]
    kinds = [type(result_from_dict(r)) for r in doc["results"]]
    assert kinds == [SaveResult, SaveResult, LoadResult]
    assert "Read (I/O):" in render_text(doc) and to_csv(doc).count("\n") == 1 + 3 * 2


def test_report_and_compare_read_a_schema_1_file(tmp_path: Path, both: tuple[SaveResult, LoadResult]) -> None:
    (tmp_path / "new.json").write_text(json.dumps(_doc(*both)))
    proc = run_bench("report", str(V1_FILE), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "LOAD: " in proc.stdout and "Read latency:" in proc.stdout
    proc = run_bench("compare", str(V1_FILE), "new.json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "load streaming" in proc.stdout and "write/read latency p99" in proc.stdout
