"""Result files as users get them: the shipped schema, CSV, report and plots, real runs."""

from __future__ import annotations

import base64
import copy
import csv
import html.parser
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from asyncckpt.results.schema import SCHEMA_VERSION, load_schema
from asyncckpt.servers.s3endpoint import S3Endpoint

from .conftest import run_bench
from .result_schema import assert_valid
from .s3_harness import new_bucket

bench = run_bench


SMALL = ("--size", "8MiB", "--chunk-size", "1MiB", "--num-buffers", "3", "-q")


@pytest.fixture(scope="module")
def file_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real file run with everything on: repeats, both methods, records, every output."""
    d = tmp_path_factory.mktemp("filerun")
    args = (*SMALL, "--method", "both", "--repeat", "2", "--json", "r.json", "--records")
    proc = bench(str(d / "ck.bin"), *args, "--csv", "r.csv", "--plots", "plots", "--report", "r.html", cwd=d)
    assert proc.returncode == 0, proc.stderr
    return d


def test_file_run_validates_with_records(file_run: Path) -> None:
    doc = json.loads((file_run / "r.json").read_text())
    assert_valid(doc)
    assert doc["mode"] == "single" and doc["command"][:3] == ["python", "-m", "asyncckpt.bench"]
    assert len(doc["results"]) == 5 and all(len(r["records"]) == 8 for r in doc["results"])
    assert {r["method"] for r in doc["results"]} == {"streaming", "preallocate"}


def test_schema_rejects_what_it_does_not_describe(file_run: Path) -> None:
    """The schema is strict: an undocumented field or a wrong type fails validation."""
    doc = json.loads((file_run / "r.json").read_text())
    for mutate in (
        lambda d: d["results"][0].update(surprise=1),
        lambda d: d["results"][0]["metadata"].update(chunk_size="32MiB"),
        lambda d: d["results"][0]["records"][0].pop("fill_s"),
        lambda d: d.update(schema_version="3.0"),
        lambda d: d["results"][0]["write_latency_s"].update(p50=-1.0),
    ):
        bad = copy.deepcopy(doc)
        mutate(bad)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, load_schema())


def test_schema_ships_as_package_data() -> None:
    from importlib import resources

    text = resources.files("asyncckpt").joinpath("schemas/result.schema.json").read_text()
    assert json.loads(text)["$defs"]["singleRun"]["properties"]["mode"] == {"const": "single"}
    assert SCHEMA_VERSION.startswith("2.")


def test_csv_has_one_row_per_chunk(file_run: Path) -> None:
    rows = list(csv.DictReader((file_run / "r.csv").open()))
    assert len(rows) == 5 * 8
    first = [r for r in rows if r["result"] == "1"]
    assert [int(r["index"]) for r in first] == list(range(8))
    assert float(first[0]["t_acquire"]) == 0.0  # relative to the run's first chunk
    io = {"save": "write", "load": "read"}
    assert all(
        float(r[f"t_{io[r['operation']]}_end"]) >= float(r[f"t_{io[r['operation']]}_start"]) >= 0
        for r in rows
    )
    assert {r["operation"] for r in rows} == {"save", "load"}


def test_plots_are_written_and_non_empty(file_run: Path) -> None:
    pngs = sorted(p.name for p in (file_run / "plots").iterdir())
    for kind in ("timeline", "throughput", "latency"):
        assert [p for p in pngs if p.startswith(kind)] == [f"{kind}-{i}.png" for i in range(1, 6)]
    assert "waits.png" in pngs
    for p in (file_run / "plots").iterdir():
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000


class _Refs(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.attrs: list[tuple[str, str]] = []
        self.tags: list[str] = []
        self.images: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.attrs += [(k, v or "") for k, v in attrs]
        if tag == "img":
            self.images.append(dict(attrs).get("src") or "")


def check_self_contained(page: str) -> _Refs:
    refs = _Refs()
    refs.feed(page)
    assert "script" not in refs.tags and "link" not in refs.tags and "iframe" not in refs.tags
    for name, value in refs.attrs:
        assert not value.lower().startswith(("http:", "https:", "//", "ftp:")), (name, value)
    assert "url(" not in page and "@import" not in page
    for src in refs.images:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1])[:4] == b"\x89PNG"
    return refs


def test_html_report_is_self_contained(file_run: Path) -> None:
    page = (file_run / "r.html").read_text()
    refs = check_self_contained(page)
    assert len(refs.images) == len(list((file_run / "plots").iterdir()))
    assert "schema_version" in page and "Bottleneck" not in page  # -q: summary tables only


def test_report_rerenders_saved_json(file_run: Path, tmp_path: Path) -> None:
    proc = bench("report", str(file_run / "r.json"), "--plots", "p", "--report", "x.html", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Bottleneck:" in proc.stdout and "save (streaming)" in proc.stdout
    assert "preallocate" in proc.stdout and "load" in proc.stdout
    assert sorted(p.name for p in (tmp_path / "p").iterdir()) == sorted(
        p.name for p in (file_run / "plots").iterdir()
    )
    check_self_contained((tmp_path / "x.html").read_text())
    quiet = bench("report", str(file_run / "r.json"), "-q", "--csv", "again.csv", cwd=tmp_path)
    assert quiet.returncode == 0 and "Bottleneck:" not in quiet.stdout
    assert (tmp_path / "again.csv").read_text() == (file_run / "r.csv").read_text()


def test_report_bad_files_are_one_line(tmp_path: Path) -> None:
    (tmp_path / "nope.json").write_text("{not json")
    (tmp_path / "old.json").write_text(json.dumps({"results": []}))
    (tmp_path / "new.json").write_text(json.dumps({"schema_version": "3.0", "mode": "single"}))
    for name, fragment in (
        ("missing.json", "no result file"),
        ("nope.json", "is not JSON"),
        ("old.json", "no schema_version"),
        ("new.json", "schema_version 3.0 is not readable"),
    ):
        proc = bench("report", name, cwd=tmp_path)
        assert proc.returncode == 2, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and fragment in proc.stderr, proc.stderr


@pytest.mark.parametrize("target", ["null://x", "memory://x"])
def test_null_and_memory_runs_validate(tmp_path: Path, target: str) -> None:
    mode = ("--mode", "save") if target.startswith("null") else ()
    proc = bench(target, *SMALL, *mode, "--json", "r.json", "--records", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "r.json").read_text())
    assert_valid(doc)
    assert doc["results"][0]["metadata"]["backend"] == target.split(":")[0]


def test_without_records_validates_and_plots_what_it_can(tmp_path: Path) -> None:
    proc = bench(*SMALL, "--json", "r.json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "r.json").read_text())
    assert_valid(doc)
    assert all("records" not in r for r in doc["results"])
    rep = bench("report", "r.json", "--report", "r.html", cwd=tmp_path)
    assert rep.returncode == 0, rep.stderr
    assert "need --records" in (tmp_path / "r.html").read_text()
    csv_out = bench("report", "r.json", "--csv", "r.csv", cwd=tmp_path)
    assert csv_out.returncode == 2 and "--records" in csv_out.stderr
    assert not (tmp_path / "r.csv").exists()


def test_output_errors_come_before_any_io(tmp_path: Path) -> None:
    proc = bench(str(tmp_path / "ck.bin"), *SMALL, "--csv", "/no/such/dir/x.csv", "--keep", cwd=tmp_path)
    assert proc.returncode == 2 and "does not exist" in proc.stderr
    assert not (tmp_path / "ck.bin").exists()


def test_s3_run_on_moto_validates(moto_endpoint: S3Endpoint, tmp_path: Path) -> None:
    bucket = new_bucket(moto_endpoint)
    env = {**moto_endpoint.env(), "AWS_EC2_METADATA_DISABLED": "true"}
    args = ("--size", "11MiB", "--chunk-size", "5MiB", "--num-buffers", "3", "-q")
    proc = bench(
        f"s3://{bucket}/r.bin", *args, "--json", "r.json", "--records", "--plots", "p", cwd=tmp_path, env=env
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "r.json").read_text())
    assert_valid(doc)
    assert len({r["metadata"]["backend"] for r in doc["results"]}) == 1  # the default S3 backend
    assert moto_endpoint.secret_key not in (tmp_path / "r.json").read_text()
    assert all(p.stat().st_size > 0 for p in (tmp_path / "p").iterdir())
    assert {p.name.split("-")[0] for p in (tmp_path / "p").iterdir()} >= {"timeline", "latency", "throughput"}


def test_compare_backends_run_validates(moto_endpoint: S3Endpoint, tmp_path: Path) -> None:
    bucket = new_bucket(moto_endpoint)
    env = {**moto_endpoint.env(), "AWS_EC2_METADATA_DISABLED": "true"}
    args = ("--size", "6MiB", "--chunk-size", "5MiB", "--num-buffers", "3", "-q", "--mode", "save")
    proc = bench(
        f"s3://{bucket}/c.bin",
        *args,
        "--compare-backends",
        "--json",
        "c.json",
        "--plots",
        "p",
        cwd=tmp_path,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    doc: dict[str, Any] = json.loads((tmp_path / "c.json").read_text())
    assert_valid(doc)
    if len({r["metadata"]["backend"] for r in doc["results"]}) > 1:
        assert (tmp_path / "p" / "backends.png").stat().st_size > 0


def test_report_and_compare_say_what_a_tiered_or_workload_result_is(tmp_path: Path) -> None:
    """A tiered run's own JSON was "unknown result mode 'tiered'", a workload run's "no
    schema_version ... written before versioning: re-run it with this release"."""
    (tmp_path / "remote").mkdir()
    (tmp_path / "local").mkdir()
    run = bench(
        str(tmp_path / "remote"),
        "--local",
        str(tmp_path / "local"),
        *SMALL,
        "-q",
        "--json",
        "t.json",
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr
    (tmp_path / "w.json").write_text(json.dumps({"mode": "dlio", "workload": "llama3-8b"}))
    for name, fragment in (("t.json", "a tiered run's result"), ("w.json", "a DLIO workload run's result")):
        for command in (["report", name], ["compare", name, name]):
            proc = bench(*command, cwd=tmp_path)
            assert proc.returncode == 2, proc.stderr
            assert len(proc.stderr.strip().splitlines()) == 1 and fragment in proc.stderr, proc.stderr


def test_report_csv_of_a_result_without_records_is_refused_before_printing(tmp_path: Path) -> None:
    """It printed the whole report, then said the result has no records (exit 2)."""
    saved = bench(*SMALL, "--json", "r.json", cwd=tmp_path)
    assert saved.returncode == 0, saved.stderr
    proc = bench("report", "r.json", "--csv", "r.csv", cwd=tmp_path)
    assert proc.returncode == 2 and "no per-chunk records" in proc.stderr
    assert proc.stdout == "" and not (tmp_path / "r.csv").exists()
