"""Input validation: every bad value is named in the error, before any I/O."""

from __future__ import annotations

import pytest

from asyncckpt import AsyncCheckpointer, CheckpointConfig, ConfigError, GiB, MiB, parse_size
from asyncckpt.errors import AsyncCkptError, StorageError, TargetNotFoundError, map_os_error


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4096", 4096),
        ("512MiB", 512 * MiB),
        ("1GiB", GiB),
        ("1GB", 10**9),
        ("1.5GiB", 3 * GiB // 2),
        (" 2 kib ", 2048),
        ("7", 7),
        (123, 123),
    ],
)
def test_parse_size(text: str | int, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "abc", "1XB", "0.3B", "-1GiB", "1e9"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ConfigError, match="size"):
        parse_size(text)


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"chunk_size": 1000}, "chunk_size must be >= 4096, got 1000"),
        ({"chunk_size": 4096 * 3 + 1}, "multiple of 4096"),
        ({"num_buffers": 0}, "num_buffers must be >= 1, got 0"),
        ({"num_buffers": 2.0}, "num_buffers must be an integer, got 2.0"),
        ({"generator": "torch"}, "'torch'"),
        ({"gen_threads": 0}, "gen_threads must be >= 1"),
        ({"max_in_flight": 9, "num_buffers": 8}, "max_in_flight=9 exceeds num_buffers=8"),
        ({"direct_io": "yes"}, "direct_io must be"),
    ],
)
def test_config_errors_name_the_value(kwargs: dict[str, object], fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        CheckpointConfig(**kwargs)  # type: ignore[arg-type]
    assert fragment in str(info.value)
    assert isinstance(info.value, ValueError)


def test_config_is_frozen_and_keyword_only() -> None:
    cfg = CheckpointConfig()
    with pytest.raises(AttributeError):
        cfg.chunk_size = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        CheckpointConfig(32 * MiB)  # type: ignore[misc]
    assert cfg.pool_bytes == 8 * 32 * MiB


def test_generator_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASYNCCKPT_DATA_GEN", "numpy")
    assert CheckpointConfig().generator == "numpy"
    assert CheckpointConfig(generator="dgen").generator == "dgen"  # argument wins
    monkeypatch.setenv("ASYNCCKPT_DATA_GEN", "bogus")
    with pytest.raises(ConfigError, match="ASYNCCKPT_DATA_GEN='bogus'"):
        CheckpointConfig()


def test_checkpointer_rejects_config_and_options_together() -> None:
    with pytest.raises(ConfigError, match="not both"):
        AsyncCheckpointer(CheckpointConfig(), num_buffers=2)


def test_error_hierarchy_maps_builtins() -> None:
    err = map_os_error(FileNotFoundError(2, "No such file or directory"), "open /x")
    assert isinstance(err, TargetNotFoundError) and isinstance(err, FileNotFoundError)
    assert isinstance(err, StorageError) and isinstance(err, OSError) and isinstance(err, AsyncCkptError)
    assert "open /x" in str(err)
    # the number once: "[Errno 27] create '/x': File too large (errno 27)" said it twice
    assert str(err) == "[Errno 2] open /x: No such file or directory"
