"""S3 settings: precedence, .env, validation before I/O, redaction, URIs, optional imports."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncckpt import ConfigError, MiB, MissingDependencyError
from asyncckpt.sinks import resolve_backend
from asyncckpt.sinks.s3 import S3_BACKENDS, auto_backend, installed, sink_class
from asyncckpt.sinks.s3.config import S3Settings, parse_s3_uri, plan_parts

SECRET = "Sup3rSecretValue/xyz"


def test_precedence_options_over_environment_over_dotenv(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text(
        "# comment\nexport AWS_ENDPOINT_URL=http://dotenv:1\nAWS_REGION='eu-west-1'\n"
        f'AWS_ACCESS_KEY_ID=dotenv-key\nAWS_SECRET_ACCESS_KEY="{SECRET}"\n'
    )
    env = {"AWS_ENDPOINT_URL": "http://env:2"}
    s = S3Settings.resolve({"region": "ap-south-1"}, env=env, cwd=tmp_path)
    assert s.region == "ap-south-1" and s.sources["region"] == "backend_options"
    assert s.endpoint_url == "http://env:2" and s.sources["endpoint_url"] == "environment AWS_ENDPOINT_URL"
    assert s.access_key_id == "dotenv-key" and s.revealed("secret_access_key") == SECRET
    assert s.sources["secret_access_key"] == ".env AWS_SECRET_ACCESS_KEY"
    assert s.path_style is True  # custom endpoint → path-style
    assert S3Settings.resolve({"dotenv": False}, env={}, cwd=tmp_path).access_key_id is None


def test_region_falls_back_to_default_region_then_us_east_1() -> None:
    assert (
        S3Settings.resolve({"dotenv": False}, env={"AWS_DEFAULT_REGION": "eu-north-1"}).region == "eu-north-1"
    )
    assert S3Settings.resolve({"dotenv": False}, env={}).region == "us-east-1"
    assert S3Settings.resolve({"dotenv": False}, env={}).path_style is False  # AWS: virtual hosts


def test_secrets_never_in_repr_str_or_describe() -> None:
    s = S3Settings.resolve(
        {
            "access_key_id": "AKIAEXAMPLE",
            "secret_access_key": SECRET,
            "session_token": "tok-123456",
            "dotenv": False,
        },
        env={},
    )
    for text in (repr(s), str(s), repr(s.describe())):
        assert SECRET not in text and "tok-123456" not in text
    assert "Secret('**********')" in repr(s)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"part_size": 4 * MiB}, "below the S3 minimum of 5 MiB"),
        ({"part_size": "6GiB"}, "exceeds the S3 maximum of 5 GiB"),
        ({"checksums": "always"}, "checksums must be one of"),
        ({"payload_signing": "maybe"}, "payload_signing must be a boolean"),
        ({"endpoint_url": "localhost:9000"}, "must look like http"),
        ({"access_key_id": "only-the-key"}, "must be given together"),
        ({"partsize": 5}, "unknown S3 backend option"),
        ({"dotenv": "/nonexistent/.env"}, "no such file"),
        ({"request_timeout": 0}, "request_timeout must be a number of seconds > 0"),
        ({"request_timeout": "soon"}, "request_timeout must be a number of seconds > 0"),
    ],
)
def test_invalid_options_are_rejected(options: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        S3Settings.resolve({"dotenv": False, **options} if "dotenv" not in options else options, env={})


def test_part_layout_limits_say_what_to_change() -> None:
    assert plan_parts(10 * MiB + 1, 5 * MiB, 5 * MiB) == 3
    with pytest.raises(ConfigError, match=r"needs 10001 parts.*use part_size >= 6 MiB"):
        plan_parts(10_001 * 5 * MiB, 5 * MiB, None)
    with pytest.raises(ConfigError, match="not a multiple of part_size"):
        plan_parts(100 * MiB, 8 * MiB, 12 * MiB)
    assert plan_parts(100 * MiB, 8 * MiB, 16 * MiB) == 13  # a chunk may hold several parts


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("s3:///key", "names no bucket"),
        ("s3://bucket", "names no object key"),
        ("s3://bucket/dir/", "names a prefix"),
        ("s3://Bad_Bucket/key", "invalid bucket name"),
        ("s3://bucket/key?versionId=1", "query or fragment"),
    ],
)
def test_bad_s3_uris(uri: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_s3_uri(uri)


def test_uri_parsing() -> None:
    assert parse_s3_uri("s3://my.bucket-1/a/b/c.bin") == ("my.bucket-1", "a/b/c.bin")


def test_auto_backend_and_registration() -> None:
    assert auto_backend() == ("s3dlio" if installed("s3dlio") else "aiobotocore")
    assert resolve_backend("s3://b/k") == auto_backend()  # the library, not the scheme
    assert resolve_backend("s3://b/k", "s3") == auto_backend()
    for name in S3_BACKENDS:
        assert resolve_backend("s3://b/k", name) == name


def test_missing_library_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(S3_BACKENDS, "minio", ("minio_sink", "MinioSink", "no_such_pkg_for_test", "minio"))
    with pytest.raises(MissingDependencyError, match=r"pip install 'asyncckpt\[minio\]'"):
        sink_class("minio")


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (
            "HEAD for s3://b/k failed: service error: NotFound (no message) (req 1f403ab)",
            "TargetNotFoundError",
        ),
        ("service error: AccessDenied (req 404f)", "StoragePermissionError"),
        ("HEAD failed: status 404", "TargetNotFoundError"),
        ("HEAD failed: status 403", "StoragePermissionError"),
    ],
)
def test_s3dlio_errors_map_by_name_not_by_digits_in_ids(message: str, expected: str) -> None:
    pytest.importorskip("s3dlio", reason="s3dlio is part of the test extra")
    from concurrent.futures import ThreadPoolExecutor

    from asyncckpt.sinks import SinkOptions, make_sink

    with ThreadPoolExecutor(1) as executor:
        options = SinkOptions(extra={"endpoint_url": "http://127.0.0.1:9", "dotenv": False})
        sink = make_sink("s3://bucket/key", backend="s3dlio", executor=executor, options=options)
        err = sink.map_error(RuntimeError(message), "stat")  # type: ignore[attr-defined]
    assert type(err).__name__ == expected, str(err)


def test_status_digits_inside_names_are_not_statuses() -> None:
    from asyncckpt.errors import StoragePermissionError, TargetNotFoundError
    from asyncckpt.sinks.s3.common import storage_error
    from asyncckpt.sinks.s3.config import S3Settings

    settings = S3Settings.resolve({"endpoint_url": "http://127.0.0.1:9", "dotenv": False})
    denied = "SignatureDoesNotMatch on s3://t-96f7ea404ee64d81/ckpt.bin"
    assert isinstance(storage_error(denied, denied, "put", settings), StoragePermissionError)
    missing = "NoSuchKey: s3://b-403f/k"
    assert isinstance(storage_error(missing, missing, "get", settings), TargetNotFoundError)
    plain = "timeout talking to s3://b-404e/k"
    assert type(storage_error(plain, plain, "get", settings)).__name__ == "StorageError"


def test_request_timeout_option() -> None:
    settings = S3Settings.resolve({"request_timeout": "2.5", "dotenv": False}, env={})
    assert settings.request_timeout == 2.5 and settings.describe()["request_timeout_s"] == 2.5
    assert S3Settings.resolve({"dotenv": False}, env={}).request_timeout == 10.0


@pytest.mark.parametrize("backend", ["aiobotocore", "minio", "s3dlio", "s3torchconnector", "obstore"])
def test_an_upload_reports_its_first_failure_over_later_ones(backend: str) -> None:
    import errno
    from concurrent.futures import ThreadPoolExecutor

    from asyncckpt.errors import NoSpaceError, StorageError
    from asyncckpt.sinks import SinkOptions, make_sink

    with ThreadPoolExecutor(1) as executor:
        options = SinkOptions(
            chunk_size=5 * MiB, extra={"endpoint_url": "http://127.0.0.1:9", "dotenv": False}
        )
        sink = make_sink("s3://bucket/key", backend=backend, executor=executor, options=options)
    first = NoSpaceError(errno.ENOSPC, "upload part 2: 503 out of space")
    assert sink.first_cause(first) is first  # type: ignore[attr-defined]
    later = sink.first_cause(StorageError(errno.EIO, "complete: request has already completed"))  # type: ignore[attr-defined]
    assert type(later) is NoSpaceError and str(later) == str(first)
    assert "request has already completed" in "".join(later.__notes__)
    sink.layout(10 * MiB)  # type: ignore[attr-defined]  # a new upload starts with a clean slate
    other = StorageError(errno.EIO, "another upload")
    assert sink.first_cause(other) is other  # type: ignore[attr-defined]


def test_mountpoint_lost_cause_is_not_passed_off_as_the_cause() -> None:
    pytest.importorskip("s3torchconnectorclient", reason="part of the test extra")
    from concurrent.futures import ThreadPoolExecutor

    from asyncckpt.sinks import SinkOptions, make_sink

    with ThreadPoolExecutor(1) as executor:
        options = SinkOptions(
            chunk_size=5 * MiB, extra={"endpoint_url": "http://127.0.0.1:9", "dotenv": False}
        )
        sink = make_sink("s3://bucket/key", backend="s3torchconnector", executor=executor, options=options)
    text = "Client error: Unknown CRT error: CRT error 14366: aws-c-s3: AWS_ERROR_S3_REQUEST_HAS_COMPLETED"
    err = sink.map_error(RuntimeError(text), "complete upload of")  # type: ignore[attr-defined]
    assert "already failed in the background" in str(err) and "not known" in str(err)
    assert "out of space" not in str(err)


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"part_size": "3MiB"}, "below the S3 minimum"),
        ({"nope": 1}, "unknown S3 backend option(s) nope"),
        ({"checksums": "always"}, "'always'"),
        ({"max_in_flight": 0}, "max_in_flight"),
    ],
)
def test_backend_options_are_validated_when_the_config_is_built(
    options: dict[str, object], words: str
) -> None:
    from asyncckpt import AsyncCheckpointer
    from asyncckpt.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        AsyncCheckpointer(backend_options=options)  # no save, no I/O: refused at construction
    assert words in str(info.value)
