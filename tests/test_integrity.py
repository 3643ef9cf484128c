"""``integrity="none"`` (issue 29, part 4): a save that computes no checksum anywhere, says so
in its result and its sealed manifest, and a later load that refuses to pretend it verified.

Real files throughout; the S3 side (s3dlio generating in place in its writer process) is in
tests/test_s3dlio_in_place.py, and the CLI flag runs the real bench in a child interpreter.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest

from asyncckpt import AsyncCheckpointer, CheckpointConfig, ConfigError
from asyncckpt.engine.manifest import Manifest
from asyncckpt.engine.seal import locate, unseal
from asyncckpt.errors import ChecksumMismatchError, IntegrityError, ManifestError, UnverifiableError
from asyncckpt.units import MiB

from .conftest import flip_byte, generated, run_bench

CHUNK = 1 * MiB
SIZE = 3 * CHUNK + 4099  # a short last chunk: the footer follows it
SEED = 41


def checkpointer(**kw: Any) -> AsyncCheckpointer:
    return AsyncCheckpointer(chunk_size=CHUNK, num_buffers=3, seed=SEED, **kw)


def sealed_json(path: Path) -> dict[str, Any]:
    """The manifest JSON sealed into a checkpoint file, as written (not as parsed)."""
    raw = path.read_bytes()
    found = locate(raw, len(raw), str(path))
    assert found is not None
    offset, length = found
    doc: dict[str, Any] = json.loads(raw[offset : offset + length])
    return doc


@pytest.mark.parametrize("value", ["md5", "CRC32C", "", None, True])
def test_bad_integrity_is_refused_naming_the_value(value: object) -> None:
    with pytest.raises(ConfigError, match="integrity") as info:
        CheckpointConfig(integrity=value)  # type: ignore[arg-type]
    assert repr(value) in str(info.value)


def test_integrity_defaults_to_crc32c() -> None:
    assert CheckpointConfig().integrity == "crc32c"
    assert CheckpointConfig(integrity="none").integrity == "none"


@pytest.mark.parametrize("method", ["streaming", "preallocate"])
async def test_a_save_without_integrity_computes_no_checksum_and_says_so(tmp_path: Path, method: str) -> None:
    path = tmp_path / "none.bin"
    async with checkpointer(integrity="none") as ckpt:
        result = await ckpt.save(path, SIZE, method=method)  # type: ignore[arg-type]
    assert result.integrity == "none"
    # the checksum stage sets each record's CRC32C and times it: it never ran
    assert len(result.records) == result.chunks == 4
    assert all(r.checksum is None and r.checksum_s == 0 and r.checksum_cpu_s == 0 for r in result.records)
    assert result.checksum_s == 0 and "checksum" not in result.cpu_stages_s
    assert "Checksum" not in result.bottleneck_counts
    assert result.to_dict()["integrity"] == "none"
    assert "no checksums" in str(result)
    # the sealed manifest says so: a newer format version, no checksum section at all
    doc = sealed_json(path)
    assert doc["integrity"] == "none" and "checksum" not in doc and doc["version"] == 2
    data, manifest = unseal(path.read_bytes())
    assert manifest.integrity == "none" and manifest.chunk_crc32c == () and manifest.object_crc32c is None
    assert data == await generated(SIZE, CHUNK, SEED)


async def test_a_default_save_keeps_checksums_and_the_old_manifest_format(tmp_path: Path) -> None:
    path = tmp_path / "crc.bin"
    async with checkpointer() as ckpt:
        result = await ckpt.save(path, SIZE)
    assert result.integrity == "crc32c"
    assert all(r.checksum is not None for r in result.records)
    assert "no checksums" not in str(result)
    doc = sealed_json(path)  # byte for byte the format readers before this release know
    assert doc["version"] == 1 and "integrity" not in doc and len(doc["checksum"]["chunks"]) == 4


async def test_a_verifying_load_refuses_an_object_saved_without_checksums(tmp_path: Path) -> None:
    path = tmp_path / "none.bin"
    async with checkpointer(integrity="none") as saver:
        await saver.save(path, SIZE)
    async with checkpointer() as ckpt:  # the loader's own integrity setting does not matter
        for verify in (True, "checksum"):
            with pytest.raises(UnverifiableError) as info:
                await ckpt.load(path, verify=verify)
            message = str(info.value)
            assert "integrity='none'" in message and "cannot be verified" in message
            assert "verify=False" in message and "verify='regenerate'" in message
            assert isinstance(info.value, IntegrityError)
            assert not isinstance(info.value, ChecksumMismatchError | ManifestError)  # not "corrupt"
        unchecked = await ckpt.load(path, verify=False)
        assert unchecked.size_bytes == SIZE
        assert unchecked.metadata.extra["manifest_integrity"] == "none"
        assert "no checksums" in str(unchecked)
        out = bytearray(SIZE)
        regenerated = await ckpt.load(path, verify="regenerate", into=out)
        assert regenerated.metadata.extra["verify"] == "regenerate"
        assert bytes(out) == await generated(SIZE, CHUNK, SEED)


async def test_regeneration_still_catches_a_flipped_byte_without_checksums(tmp_path: Path) -> None:
    path = tmp_path / "none.bin"
    async with checkpointer(integrity="none") as ckpt:
        await ckpt.save(path, SIZE)
        await asyncio.to_thread(flip_byte, path, CHUNK + 7)
        with pytest.raises(ChecksumMismatchError) as info:
            await ckpt.load(path, verify="regenerate")
    assert info.value.offset == CHUNK + 7


async def test_caller_data_without_checksums_loads_unverified_only(tmp_path: Path) -> None:
    path = tmp_path / "caller.bin"
    data = os.urandom(SIZE)
    async with checkpointer(integrity="none") as ckpt:
        result = await ckpt.save(path, data=data)
        assert all(r.checksum is None for r in result.records)
        with pytest.raises(UnverifiableError) as info:
            await ckpt.load(path)
        # nothing to regenerate caller data from: only verify=False is offered
        assert "verify=False" in str(info.value) and "regenerate" not in str(info.value)
        out = bytearray(SIZE)
        await ckpt.load(path, verify=False, into=out)
    assert bytes(out) == data


async def test_state_saves_refuse_integrity_none_before_any_io(tmp_path: Path) -> None:
    np = pytest.importorskip("numpy")
    path = tmp_path / "state.safetensors"
    async with checkpointer(integrity="none") as ckpt:
        for staging in ("none", "host"):
            with pytest.raises(ConfigError, match=r"integrity='none'.*header"):
                await ckpt.save_state(path, {"w": np.ones(8, np.float32)}, staging=staging)
        with pytest.raises(ConfigError, match=r"expect_crc32c.*integrity='none'"):
            await ckpt.save(tmp_path / "x.bin", data=b"x" * 4096, expect_crc32c=[0])
    assert await asyncio.to_thread(lambda: list(tmp_path.iterdir())) == []


def test_manifest_rules_for_the_integrity_field() -> None:
    """Version 2 is the only one that may say integrity, and "none" carries no checksums;
    version 1 (every save before this release, and crc32c saves now) reads as before."""
    base = {"format": "asyncckpt-manifest", "object": "o", "size": 5, "chunk_size": 4096}
    base |= {"generator": "dgen", "seed": 1}
    sums = {"algorithm": "crc32c", "chunks": ["0000abcd"], "object": "0000abcd"}
    ok = [
        {**base, "version": 1, "checksum": sums},
        {**base, "version": 2, "integrity": "crc32c", "checksum": sums},
        {**base, "version": 2, "integrity": "none"},
    ]
    for doc in ok:
        m = Manifest.from_json(json.dumps(doc).encode(), "m")
        assert m.integrity == doc.get("integrity", "crc32c")
        assert Manifest.from_json(m.to_json(), "again") == m
    bad = {
        "integrity in v1": {**base, "version": 1, "integrity": "none"},
        "none with checksums": {**base, "version": 2, "integrity": "none", "checksum": sums},
        "crc32c without": {**base, "version": 2, "integrity": "crc32c"},
        "unknown mode": {**base, "version": 2, "integrity": "md5", "checksum": sums},
        "no mode in v2": {**base, "version": 2, "checksum": sums},
        "v3": {**base, "version": 3, "integrity": "none"},
    }
    for name, doc in bad.items():
        with pytest.raises(ManifestError):
            Manifest.from_json(json.dumps(doc).encode(), name)


def test_cli_integrity_none_saves_and_loads_without_checksums(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    target = tmp_path / "ck.bin"
    args = [str(target), "--size", "3MiB", "--chunk-size", "1MiB", "--num-buffers", "2", "-q"]
    proc = run_bench(*args, "--integrity", "none", "--json", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "no checksums" in proc.stdout
    results = json.loads(out.read_text())["results"]
    save, load = (next(r for r in results if r["operation"] == op) for op in ("save", "load"))
    assert save["integrity"] == "none" and all(r["checksum"] is None for r in save.get("records", []))
    assert load["metadata"]["extra"]["verify"] == "none"  # the load's default follows the save


def test_cli_integrity_refusals_are_one_line_rc_2(tmp_path: Path) -> None:
    target = str(tmp_path / "ck.bin")
    for extra, said in (
        (["--integrity", "md5"], "invalid choice: 'md5'"),
        (["--integrity", "none", "--verify", "checksum"], "--integrity none computes no checksums"),
    ):
        proc = run_bench(target, "--size", "1MiB", *extra, cwd=tmp_path)
        assert proc.returncode == 2, proc.stderr
        assert said in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "ck.bin").exists()


def test_cli_keeps_checksums_by_default_under_the_mlperf_budget() -> None:
    from asyncckpt.bench.cli import build_parser, plan_from_args
    from asyncckpt.bench.scaleout import parse_with_presets

    for argv, integrity, verify in (
        (["x.bin"], "crc32c", "checksum"),
        (["x.bin", "--thread-budget", "mlperf", "--model", "llama3-8b"], "crc32c", "checksum"),
        (["x.bin", "--integrity", "none"], "none", False),
        (["x.bin", "--integrity", "none", "--verify", "regenerate"], "none", "regenerate"),
    ):
        args, _ = parse_with_presets(build_parser(), argv)
        plan = plan_from_args(args)
        assert (plan.config.integrity, plan.verify) == (integrity, verify), argv


async def test_a_load_of_a_none_object_under_the_cli_verify_default_is_refused(tmp_path: Path) -> None:
    """``--mode load`` of an object saved with integrity none, checksum verification asked."""
    path = tmp_path / "none.bin"
    async with checkpointer(integrity="none") as ckpt:
        await ckpt.save(path, CHUNK)
    proc = await asyncio.to_thread(
        run_bench, str(path), "--mode", "load", "--chunk-size", "1MiB", "-q", cwd=tmp_path
    )
    assert proc.returncode == 1 and "cannot be verified" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and path.exists()
