"""Secrets: a type that cannot print its value, endpoint URLs without user:password@, and error
messages built without secrets (never scrubbed afterwards)."""

from __future__ import annotations

import copy
import logging
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from asyncckpt import AsyncCheckpointer, CheckpointConfig, ConfigError, Secret
from asyncckpt.sinks.s3.common import storage_error
from asyncckpt.sinks.s3.config import S3Settings
from asyncckpt.sinks.s3.log_guard import MaskSessionToken

VALUE = "pw-Distinct-9f3a"


def test_secret_never_shows_its_value() -> None:
    s = Secret(VALUE)
    old_style = "%s %r" % (s, s)  # noqa: UP031 - the formatting older code uses
    shown = [repr(s), str(s), f"{s}", f"{s!r}", f"{s:>40}", old_style, repr([s]), repr({"k": s})]
    assert all(VALUE not in text for text in shown)
    assert repr(s) == "Secret('**********')"
    assert s.reveal() == VALUE
    assert pickle.loads(pickle.dumps(s)) == s and copy.deepcopy(s).reveal() == VALUE  # writer processes
    assert Secret(VALUE) != Secret(VALUE + "x") and bool(Secret("")) is False
    with pytest.raises(ConfigError) as info:
        Secret(123)  # type: ignore[arg-type]
    assert "123" not in str(info.value)


def test_config_and_settings_hold_secrets_wrapped() -> None:
    options = {"secret_access_key": VALUE, "session_token": VALUE + "-tok", "access_key_id": "AKIA1"}
    config = CheckpointConfig(backend_options=options)
    assert isinstance(config.backend_options["secret_access_key"], Secret)
    assert isinstance(config.backend_options["session_token"], Secret)
    settings = S3Settings.resolve({**config.backend_options, "dotenv": False}, env={})
    for text in (repr(config), str(config), repr(settings), str(settings), repr(settings.describe())):
        assert VALUE not in text
    assert settings.revealed("secret_access_key") == VALUE
    env = S3Settings.resolve(
        {"dotenv": False}, env={"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": VALUE}
    )
    assert isinstance(env.secret_access_key, Secret) and VALUE not in repr(env)
    with pytest.raises(ConfigError, match="secret_access_key must be a string, got a int"):
        CheckpointConfig(backend_options={"secret_access_key": 12345})


@pytest.mark.parametrize(
    "options",
    [
        {"endpoint_url": "http://user:pw123@127.0.0.1:9000"},
        {"endpoints": ["http://127.0.0.1:9000", "http://user:pw123@127.0.0.1:9001"]},
        {"endpoints": "http://127.0.0.1:9000,https://pw123@host:9001"},
    ],
)
def test_userinfo_in_endpoint_is_refused_when_the_config_is_built(options: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match=r"\*\*\*@") as info:
        AsyncCheckpointer(backend_options=options)
    assert "pw123" not in str(info.value) and "user" not in str(info.value).split("***@")[0][-10:]


def test_userinfo_in_endpoint_from_environment_is_refused() -> None:
    env = {"AWS_ENDPOINT_URL": "http://user:pw123@127.0.0.1:9000"}
    with pytest.raises(
        ConfigError, match=r"environment AWS_ENDPOINT_URL\) 'http://\*\*\*@127.0.0.1:9000'"
    ) as e:
        S3Settings.resolve({"dotenv": False}, env=env)
    assert "pw123" not in str(e.value)
    with pytest.raises(ConfigError, match=r"\*\*\*@") as e:
        S3Settings.resolve({"dotenv": False}, env={"S3_ENDPOINT_URIS": "http://a:1,http://u:pw123@b:2"})
    assert "pw123" not in str(e.value)


def test_cli_refuses_userinfo_endpoint_in_one_line(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "asyncckpt.bench",
            "s3://bucket/k.bin",
            "--endpoint",
            "http://u:pw123@127.0.0.1:1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "http://***@127.0.0.1:1" in proc.stderr and "pw123" not in proc.stderr + proc.stdout


def test_messages_are_not_mangled_by_a_short_secret() -> None:
    """Text replacement of a one-letter secret used to rewrite every 's' in a message."""
    settings = S3Settings.resolve(
        {"access_key_id": "AKIA1", "secret_access_key": "s", "dotenv": False, "endpoint_url": "http://h:1"},
        env={},
    )
    err = storage_error("AccessDenied", "AccessDenied: Access Denied", "save s3://bucket/keys.bin", settings)
    assert err.strerror.startswith("save s3://bucket/keys.bin: AccessDenied: Access Denied (check AWS_")


def test_botocore_debug_logs_mask_the_session_token() -> None:
    record = logging.LogRecord(
        "botocore.endpoint",
        logging.DEBUG,
        __file__,
        1,
        "headers=%s",
        ({"X-Amz-Security-Token": VALUE},),
        None,
    )
    assert MaskSessionToken().filter(record)
    assert VALUE not in record.getMessage() and "X-Amz-Security-Token" in record.getMessage()
    canonical = logging.LogRecord(
        "botocore.auth", logging.DEBUG, __file__, 1, f"x-amz-security-token:{VALUE}\n", None, None
    )
    MaskSessionToken().filter(canonical)
    assert VALUE not in canonical.getMessage()
