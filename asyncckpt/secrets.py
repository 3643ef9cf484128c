"""Secrets held in a type that cannot print them, and URLs that must not carry them.

A secret is wrapped in :class:`Secret` where it enters (``backend_options``, the
environment, a ``.env`` file) and unwrapped with :meth:`Secret.reveal` only in the call that
hands it to a client library. Every repr, str, f-string, log line and error message built
from a config therefore shows ``Secret('**********')``: messages are built without secrets,
never scrubbed afterwards (replacing a short secret's text mangles a message and reveals it).
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from .errors import ConfigError

MASK = "**********"
#: backend option names whose values are secrets
SECRET_OPTIONS = (
    "secret_access_key",
    "session_token",
    "account_key",
    "sas_token",
    "connection_string",
    "token",  # GCS
    "service_account_key",  # GCS
)
#: backend option names holding endpoint URLs (one, or a list / comma list)
URL_OPTIONS = ("endpoint_url", "endpoints")


class Secret:
    """A string that never shows itself; ``reveal()`` is the one way to the value."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        if not isinstance(value, str):
            raise ConfigError(f"a secret must be a string, got a {type(value).__name__}")
        self._value = value

    def reveal(self) -> str:
        """The value, for the client call that needs it (and nothing else)."""
        return self._value

    def __repr__(self) -> str:
        return f"Secret({MASK!r})"

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return format(repr(self), spec)

    def __bool__(self) -> bool:
        return bool(self._value)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Secret):
            return NotImplemented
        return hmac.compare_digest(self._value.encode(), other._value.encode())

    def __hash__(self) -> int:
        return hash((Secret, self._value))

    def __reduce__(self) -> tuple[Any, ...]:  # a writer process receives it pickled
        return (Secret, (self._value,))


def as_secret(name: str, value: object) -> Secret | None:
    """``value`` wrapped (None stays None); the error names the option, never the value."""
    if value is None or isinstance(value, Secret):
        return value
    if not isinstance(value, str):
        raise ConfigError(f"backend option {name} must be a string, got a {type(value).__name__}")
    return Secret(value)


def masked_url(url: str) -> str:
    """``url`` with any user information replaced by ``***`` (safe to print)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<an unparsable URL>" if "@" in url else url
    if "@" not in parts.netloc:
        return url
    host = parts.netloc.rpartition("@")[2]
    return parts._replace(netloc=f"***@{host}").geturl()


def check_no_userinfo(url: object, what: str) -> None:
    """Refuse ``http://user:password@host``: the password would be in every message naming it."""
    if not isinstance(url, str):
        return  # the type is somebody else's error; nothing to leak here
    try:
        netloc = urlsplit(url).netloc
    except ValueError:
        netloc = url
    if "@" in netloc:
        raise ConfigError(
            f"{what} {masked_url(url)!r} carries user credentials in the URL; give them as "
            "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or backend_options access_key_id / "
            "secret_access_key) and the endpoint as http(s)://host[:port]"
        )


def protect_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """``backend_options`` with secrets wrapped and endpoint URLs free of user information."""
    out = dict(options)
    for name in SECRET_OPTIONS:
        if name in out:
            out[name] = as_secret(name, out[name])
    for name in URL_OPTIONS:
        value = out.get(name)
        urls = value.split(",") if isinstance(value, str) else value
        if isinstance(urls, (list, tuple)):
            for url in urls:
                check_no_userinfo(url.strip() if isinstance(url, str) else url, f"backend option {name}")
    return out
