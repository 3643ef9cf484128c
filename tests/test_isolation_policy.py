"""The writer policy: isolation and start method, decided before any I/O or import."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap

import pytest

from asyncckpt import AsyncCheckpointer, CheckpointConfig, CheckpointManager, ConfigError
from asyncckpt.bench.cli import build_parser, plan_from_args
from asyncckpt.sinks.isolation import policy
from asyncckpt.sinks.isolation.policy import resolve_policy

NO_ENV: dict[str, str] = {}


def test_auto_isolates_s3dlio_only() -> None:
    assert resolve_policy("file", environ=NO_ENV).isolation == "none"
    assert resolve_policy("aiobotocore", environ=NO_ENV).isolation == "none"
    p = resolve_policy("s3dlio", environ=NO_ENV)
    assert (p.isolation, p.start_method, p.source) == ("process", "forkserver", "auto")


def test_auto_start_method_fork_for_files_forkserver_for_object_stores() -> None:
    assert resolve_policy("file", isolation="process", environ=NO_ENV).start_method == "fork"
    assert resolve_policy("null", isolation="process", environ=NO_ENV).start_method == "fork"
    assert resolve_policy("aiobotocore", isolation="process", environ=NO_ENV).start_method == "forkserver"


@pytest.mark.parametrize("backend", ["s3dlio", "aiobotocore", "minio", "s3torchconnector", "obstore"])
def test_fork_refused_for_object_stores(backend: str) -> None:
    with pytest.raises(ConfigError, match=r"fork.*refused.*Tokio") as info:
        resolve_policy(backend, mp_start_method="fork", environ=NO_ENV)
    assert isinstance(info.value, ValueError)
    assert backend in str(info.value) and "forkserver" in str(info.value)


def test_fork_refused_through_config_and_env() -> None:
    with pytest.raises(ConfigError, match="Tokio"):
        CheckpointConfig(backend="s3dlio", mp_start_method="fork")
    with pytest.raises(ConfigError, match="Tokio"):
        AsyncCheckpointer(backend="aiobotocore", isolation="process", mp_start_method="fork")
    with pytest.raises(ConfigError, match="ASYNCCKPT_MP_START_METHOD"):
        resolve_policy("s3dlio", environ={"ASYNCCKPT_MP_START_METHOD": "fork"})


def test_fork_refusal_imports_no_client_library() -> None:
    code = textwrap.dedent(
        """
        import sys
        from asyncckpt import AsyncCheckpointer, ConfigError
        try:
            AsyncCheckpointer(backend="s3dlio", mp_start_method="fork")
        except ConfigError as exc:
            print("refused:", exc)
        else:
            raise SystemExit("fork was accepted")
        loaded = [m for m in ("s3dlio", "aiobotocore", "minio") if m in sys.modules]
        assert not loaded, loaded
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "refused:" in out.stdout


#: each backend's client library and the heavy packages it pulls in
_LIBRARIES = {
    "aiobotocore": ("aiobotocore", "botocore", "aiohttp"),
    "minio": ("minio", "urllib3"),
    "s3dlio": ("s3dlio",),
}


@pytest.mark.parametrize("backend", sorted(_LIBRARIES))
def test_a_checkpointer_and_its_sinks_are_made_without_importing_the_library(backend: str) -> None:
    """Making a checkpointer checks its configuration (is the backend isolated? its default
    parts in flight?) and ``iter_load`` makes its sink synchronously: both on the caller's
    loop, where importing aiobotocore took 0.4 s and minio 0.2 s. The import belongs to
    ``import_library``, which a checkpointer runs in a thread before the first use."""
    code = textwrap.dedent(
        f"""
        import sys
        from asyncckpt import AsyncCheckpointer
        from asyncckpt.sinks import import_backend

        libraries = {_LIBRARIES[backend]!r}
        ckpt = AsyncCheckpointer(backend={backend!r})
        stream = ckpt.iter_load("s3://bucket/key")
        loaded = [m for m in libraries if m in sys.modules]
        assert not loaded, f"imported on the caller's loop: {{loaded}}"
        import_backend({backend!r})
        missing = [m for m in libraries if m not in sys.modules]
        assert not missing, f"import_library left out {{missing}}"
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


def test_precedence_argument_then_env_then_auto(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"ASYNCCKPT_MP_START_METHOD": "spawn", "MLPS_CHECKPOINT_MP_START_METHOD": "forkserver"}
    p = resolve_policy("file", isolation="process", mp_start_method="fork", environ=env)
    assert (p.start_method, p.source) == ("fork", "argument")
    p = resolve_policy("file", isolation="process", environ=env)
    assert (p.start_method, p.source) == ("spawn", "ASYNCCKPT_MP_START_METHOD")
    p = resolve_policy("file", isolation="process", environ={"MLPS_CHECKPOINT_MP_START_METHOD": "forkserver"})
    assert (p.start_method, p.source) == ("forkserver", "MLPS_CHECKPOINT_MP_START_METHOD")
    # the real environment is what the checkpointer reads
    monkeypatch.setenv("MLPS_CHECKPOINT_MP_START_METHOD", "spawn")
    monkeypatch.delenv("ASYNCCKPT_MP_START_METHOD", raising=False)
    p = resolve_policy("file", isolation="process")
    assert (p.start_method, p.source) == ("spawn", "MLPS_CHECKPOINT_MP_START_METHOD")
    # an explicit "auto" argument wins over the environment
    assert resolve_policy("file", isolation="process", mp_start_method="auto").start_method == "fork"


def test_bad_values_are_config_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="'threads'"):
        CheckpointConfig(isolation="threads")
    with pytest.raises(ConfigError, match="'vfork'"):
        CheckpointConfig(mp_start_method="vfork")
    with pytest.raises(ConfigError, match="writer_timeout"):
        CheckpointConfig(writer_timeout=0)
    monkeypatch.setenv("ASYNCCKPT_MP_START_METHOD", "posix_spawn")
    with pytest.raises(ConfigError, match=r"ASYNCCKPT_MP_START_METHOD.*'posix_spawn'"):
        CheckpointConfig()


def test_memory_backend_cannot_be_isolated() -> None:
    with pytest.raises(ConfigError, match="memory"):
        resolve_policy("memory", isolation="process", environ=NO_ENV)


def test_missing_method_degrades_along_the_chain(monkeypatch: pytest.MonkeyPatch) -> None:
    # the platform query is the only thing replaced: Linux has every method
    monkeypatch.setattr(policy.multiprocessing, "get_all_start_methods", lambda: ["spawn", "forkserver"])
    p = resolve_policy("file", isolation="process", environ=NO_ENV)
    assert p.start_method == "forkserver" and "degraded to forkserver" in p.reason
    monkeypatch.setattr(policy.multiprocessing, "get_all_start_methods", lambda: ["spawn"])
    assert resolve_policy("file", isolation="process", environ=NO_ENV).start_method == "spawn"
    assert resolve_policy("s3dlio", environ=NO_ENV).start_method == "spawn"


def test_bench_cli_passes_isolation_through() -> None:
    args = build_parser().parse_args(
        ["/tmp/x", "--isolation", "process", "--mp-start-method", "spawn", "--writer-timeout", "7"]
    )
    cfg = plan_from_args(args).config
    assert (cfg.isolation, cfg.mp_start_method, cfg.writer_timeout) == ("process", "spawn", 7.0)
    with pytest.raises(ConfigError, match="Tokio"):
        plan_from_args(
            build_parser().parse_args(["/tmp/x", "--backend", "s3dlio", "--mp-start-method", "fork"])
        )


def test_forkserver_preload_is_appended_once() -> None:
    from multiprocessing import forkserver

    from asyncckpt.sinks.isolation.proc import CHILD_MODULE, preload_in_forkserver

    server = forkserver._forkserver  # type: ignore[attr-defined]
    saved = list(server._preload_modules)
    try:
        forkserver.set_forkserver_preload(["__main__", "json"])  # an application's own list
        preload_in_forkserver()
        preload_in_forkserver()
        assert server._preload_modules == ["__main__", "json", CHILD_MODULE]
    finally:
        forkserver.set_forkserver_preload(saved)


def child_processes() -> list[int]:
    """This process's children, as the kernel lists them (writer processes, forkservers)."""
    out: list[int] = []
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/children") as f:
            out += [int(p) for p in f.read().split()]
    return out


@pytest.mark.parametrize(
    ("uri", "named"),
    [
        ("s3://bucket", "names no object key"),
        ("s3://ml/x", "invalid bucket name 'ml'"),
        ("s3://bucket/dir/", "names a prefix"),
    ],
)
async def test_a_bad_s3_uri_is_refused_before_a_writer_process_starts(uri: str, named: str) -> None:
    """With s3dlio isolated (the default), the URI was checked only in the child: after it had
    started (1.4-2.9 s), and a script without a ``__main__`` guard ran again in it."""
    before = await asyncio.to_thread(child_processes)
    async with AsyncCheckpointer(backend="s3dlio", isolation="process") as ckpt:
        for call in (ckpt.save(uri, data=b"x" * 10), ckpt.load(uri), ckpt.load_state(uri)):
            with pytest.raises(ConfigError, match=named) as err:
                await call
            assert "writer process" not in str(err.value)
        assert await asyncio.to_thread(child_processes) == before


def test_a_manager_on_a_bad_bucket_is_refused_when_made() -> None:
    with pytest.raises(ConfigError, match=r"invalid bucket name 'ml' in 's3://ml/run'"):
        CheckpointManager("s3://ml/run")
