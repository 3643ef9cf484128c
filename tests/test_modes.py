"""Mode strings are defined once (asyncckpt.modes); the CLI's choices and validation follow."""

from __future__ import annotations

from typing import Any, get_args

import pytest

from asyncckpt import modes
from asyncckpt.bench.cli import build_parser
from asyncckpt.bench.load_args import VERIFY_CHOICES
from asyncckpt.config import CheckpointConfig
from asyncckpt.errors import ConfigError
from asyncckpt.sinks.s3.endpoints import EndpointRouter

CLI_MODES = {
    "generator": modes.Generator,
    "method": modes.BenchMethod,
    "direct_io": modes.Switch,
    "cpu_idle": modes.Switch,
    "lb_strategy": modes.LoadBalanceStrategy,
    "loop": modes.LoopKind,
    "isolation": modes.Isolation,
    "mp_start_method": modes.StartMethod,
    "embedded_s3": modes.EmbeddedServer,
    "embedded_store": modes.EmbeddedStore,
    "mode": modes.BenchMode,
    "verify": modes.VerifyMode,
}


def test_cli_choices_are_the_literals_args() -> None:
    actions = {a.dest: a for a in build_parser()._actions}
    for dest, alias in CLI_MODES.items():
        assert tuple(actions[dest].choices or ()) == get_args(alias), dest
    assert tuple(VERIFY_CHOICES) == get_args(modes.VerifyMode)


@pytest.mark.parametrize(
    ("options", "bad"),
    [
        ({"isolation": "sandbox"}, "'sandbox'"),
        ({"mp_start_method": "vfork"}, "'vfork'"),
        ({"generator": "urandom"}, "'urandom'"),
    ],
)
def test_a_bad_mode_is_a_config_error_naming_it(options: dict[str, Any], bad: str) -> None:
    with pytest.raises(ConfigError, match=f"must be one of .*got {bad}"):
        CheckpointConfig(**options)


def test_router_refuses_an_unknown_strategy() -> None:
    with pytest.raises(ConfigError, match="got 'fastest'"):
        EndpointRouter(["http://a:1"], "fastest")


def test_parse_folds_text_unless_told_not_to() -> None:
    assert modes.parse("isolation", " Process ", modes.Isolation) == "process"
    with pytest.raises(ConfigError, match="staging must be one of none, host, got 'Host'"):
        modes.parse("staging", "Host", modes.StagingMode, fold=False)
