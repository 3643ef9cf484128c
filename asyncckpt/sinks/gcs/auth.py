"""Bearer tokens for GCS from a service-account key, through google-auth.

google-auth (the ``gcs`` extra) is imported on first use. Its refresh is blocking HTTP (a
signed JWT assertion POSTed to the key's ``token_uri``): it runs in a worker thread
(:func:`~asyncckpt.blocking.run_blocking`), never on the event loop, one at a time (an
``asyncio.Lock``), and only when google-auth says the token is no longer ``valid`` (absent, or
within its refresh margin of ``expiry``). One :class:`TokenSource` serves every object of a
store (the sink keeps it in the store's ``shared`` cache, as it does the aiohttp session).

Errors are mapped here, at the boundary, to one line naming the account (``client_email``) and
the token endpoint, never the key: a refused key (``RefreshError``) is a
:class:`~asyncckpt.errors.StoragePermissionError`, an unreachable endpoint (``TransportError``)
a :class:`~asyncckpt.errors.StorageError`, a key google-auth cannot read a
:class:`~asyncckpt.errors.ConfigError` (before any request).
"""

from __future__ import annotations

import asyncio
import errno
import functools
import json
from concurrent.futures import Executor
from typing import Any, NamedTuple

from ...blocking import run_blocking
from ...errors import ConfigError, MissingDependencyError, StorageError, StoragePermissionError
from ...secrets import Secret

#: what the tokens may do: read and write objects (no bucket administration)
SCOPES = ("https://www.googleapis.com/auth/devstorage.read_write",)


class _GoogleAuth(NamedTuple):
    service_account: Any
    Request: Any
    exceptions: Any


@functools.cache
def _google_auth() -> _GoogleAuth:
    """google-auth (the ``gcs`` extra), imported on first use."""
    try:
        import google.auth.exceptions
        import google.auth.transport.requests
        import google.oauth2.service_account
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise MissingDependencyError(
            "google-auth", "gcs", "a GCS service-account key (backend 'gcs', gs://)"
        ) from exc
    return _GoogleAuth(
        google.oauth2.service_account, google.auth.transport.requests.Request, google.auth.exceptions
    )


def _refresh(credentials: Any, request: Any) -> None:
    """The blocking exchange (in a worker thread)."""
    credentials.refresh(request)


class TokenSource:
    """A service-account key's access tokens, refreshed before they expire, one refresh at a time."""

    def __init__(self, key: Secret, client_email: str, token_uri: str, timeout: tuple[float, float]) -> None:
        self._key, self.client_email, self.token_uri = key, client_email, token_uri
        self._timeout = timeout
        self._credentials: Any = None
        self._request: Any = None
        self._lock = asyncio.Lock()
        self._refused: str | None = None  # a token GCS answered 401 to: not used again
        self.refreshes = 0  # token requests made (tests and the run metadata count them)

    def __repr__(self) -> str:
        return (
            f"TokenSource(client_email={self.client_email!r}, token_uri={self.token_uri!r}, key={self._key})"
        )

    def _build(self) -> Any:
        lib = _google_auth()
        try:
            credentials = lib.service_account.Credentials.from_service_account_info(
                json.loads(self._key.reveal()), scopes=list(SCOPES)
            )
        except (ValueError, TypeError, KeyError):
            # google-auth's message may quote the key's fields: ours names the account only
            raise ConfigError(
                f"the GCS service-account key of {self.client_email} cannot be read by google-auth "
                "(its private_key is not a valid PEM RSA private key)"
            ) from None
        session = lib.Request()
        timeout = self._timeout

        def request(*args: Any, **kwargs: Any) -> Any:  # google-auth's default waits 120 s
            kwargs.setdefault("timeout", timeout)
            return session(*args, **kwargs)

        self._request = request
        return credentials

    async def token(self, executor: Executor) -> Secret:
        """A valid access token: the one held, or a new one (google-auth imported, the key read
        and the refresh made in a worker thread)."""
        credentials = self._credentials
        if credentials is None or self._lock.locked() or not self._usable(credentials):
            async with self._lock:  # the thread mutates the credentials: none is read meanwhile
                credentials = self._credentials
                if credentials is None or not self._usable(credentials):
                    self.refreshes += 1
                    credentials = self._credentials = await run_blocking(
                        executor, self._exchange, credentials
                    )
        return Secret(str(credentials.token))

    def _usable(self, credentials: Any) -> bool:
        return bool(credentials.valid) and credentials.token != self._refused

    def refused(self, token: str) -> None:
        """GCS refused ``token`` (401) before its expiry: the next caller gets a new one."""
        self._refused = token

    def _exchange(self, credentials: Any) -> Any:
        """The refresh (blocking; the credentials built first if need be), its errors mapped to
        one line naming the account, not the key. Returns the refreshed credentials."""
        errors = _google_auth().exceptions
        if credentials is None:
            credentials = self._build()
        try:
            _refresh(credentials, self._request)
        except errors.RefreshError as exc:
            detail = str(exc.args[0] if exc.args else exc).replace("\n", " ")[:300]
            raise StoragePermissionError(
                errno.EACCES,
                f"the token endpoint {self.token_uri} refused the GCS service-account key of "
                f"{self.client_email} ({detail}); check that the key is current (not deleted or "
                "disabled) and its account exists",
            ) from None
        except errors.TransportError as exc:
            cause = exc.args[0] if exc.args and isinstance(exc.args[0], Exception) else exc
            name = type(cause).__name__
            if "Timeout" in name and "Connect" not in name:
                within = f"within request_timeout {self._timeout[1]:g} s"
                problem = f"no answer from the token endpoint {self.token_uri} {within} ({name})"
            else:
                problem = f"cannot reach the token endpoint {self.token_uri} ({name})"
            raise StorageError(
                errno.EIO,
                f"{problem} to exchange the GCS service-account key of {self.client_email} for a token",
            ) from None
        return credentials
