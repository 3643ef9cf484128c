"""Several S3 endpoints (front ends of one store): where they come from, and which one a
request goes to.

Interface for sinks — all a backend needs::

    router = EndpointRouter.from_env()              # or EndpointRouter(urls, strategy=..., rank=...)
    etag = await router.call(lambda ep: upload_part_via(ep, ...), nbytes=len(part))
    router.stats()                                  # plain data for the result's metadata

``call`` picks an endpoint by the strategy, runs ``fn(endpoint_url)``, records bytes/latency,
and when the endpoint refuses the connection or times out marks it down for ``down_for_s``
and retries ``fn`` on another endpoint (counted as a retry). ``fn`` must be safe to repeat
(an S3 part upload is: same part number, same bytes). For finer control,
``async with router.endpoint(nbytes) as ep:`` does one attempt with the same bookkeeping.

Strategies (``S3_LOAD_BALANCE_STRATEGY``): ``round_robin`` (per request, in turn),
``least_connections`` (fewest requests in flight), ``rank`` (``rank % N``: one endpoint per
MPI rank — the choice for backends that cannot switch endpoint per request; a down endpoint
still fails over to the next one).

Endpoint sources, first present wins: explicit arguments, ``S3_ENDPOINT_URIS`` (comma
list), ``S3_ENDPOINT_TEMPLATE`` (``http://10.0.0.{1...8}:9000``), ``S3_ENDPOINT_FILE`` (one
per line, ``#`` comments), ``AWS_ENDPOINT_URL``.
"""

from __future__ import annotations

import errno
import itertools
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from ... import env as envvars
from ... import modes
from ...errors import ConfigError
from ...node.distributed import rank_info_from_env
from ...results.metrics import percentiles

T = TypeVar("T")
STRATEGIES = modes.choices(modes.LoadBalanceStrategy)
ENV_VARS = ("S3_ENDPOINT_URIS", "S3_ENDPOINT_TEMPLATE", "S3_ENDPOINT_FILE", "AWS_ENDPOINT_URL")
_RANGE = re.compile(r"\{(\d+)\.\.\.(\d+)\}")
#: exceptions (by class name, so no client library is imported) meaning "endpoint unreachable",
#: or the connection broke mid-response (a range GET's body ended short)
_FAILOVER_NAMES = frozenset(
    {
        "EndpointConnectionError",
        "ConnectTimeoutError",
        "ReadTimeoutError",
        "ConnectionClosedError",
        "ClientConnectorError",
        "ClientOSError",
        "ServerDisconnectedError",
        "ServerTimeoutError",
        "ClientPayloadError",
        "ResponseStreamingError",
    }
)
_FAILOVER_ERRNOS = frozenset({errno.ECONNREFUSED, errno.ECONNRESET, errno.EHOSTUNREACH, errno.ENETUNREACH})


# -- where endpoints come from --------------------------------------------------------------
def validate_endpoint(url: str, source: str = "argument") -> str:
    """An ``http(s)://host[:port][/path]`` URL, stripped of a trailing slash."""
    text = url.strip()
    try:
        parts = urlsplit(text)
        port = parts.port  # raises ValueError for a bad port
    except ValueError as exc:
        raise ConfigError(f"endpoint {url!r} from {source}: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            f"endpoint {url!r} from {source}: expected http://host[:port] or https://host[:port]"
        )
    if port == 0:
        raise ConfigError(f"endpoint {url!r} from {source}: port 0 is not a valid endpoint port")
    return text.rstrip("/")


def expand_template(template: str) -> list[str]:
    """Expand every ``{a...b}`` range (ascending, zero padding kept), left to right."""
    pieces = _RANGE.split(template)
    literals, ranges = pieces[0::3], list(zip(pieces[1::3], pieces[2::3], strict=True))
    if any("{" in lit or "}" in lit for lit in literals):
        raise ConfigError(f"S3_ENDPOINT_TEMPLATE {template!r}: braces must hold a range like {{1...8}}")
    choices: list[list[str]] = []
    for lo, hi in ranges:
        a, b = int(lo), int(hi)
        if a > b:
            raise ConfigError(f"S3_ENDPOINT_TEMPLATE {template!r}: range {{{lo}...{hi}}} is descending")
        width = len(lo) if lo.startswith("0") and len(lo) > 1 else 0
        choices.append([str(n).zfill(width) for n in range(a, b + 1)])
    out = []
    for combo in itertools.product(*choices):
        text = literals[0]
        for value, lit in zip(combo, literals[1:], strict=True):
            text += value + lit
        out.append(text)
    return out


def endpoints_from_env(
    explicit: Sequence[str] | None = None, env: Mapping[str, str] | None = None
) -> tuple[list[str], str]:
    """``(endpoints, source)``; ``([], "none")`` when nothing is configured."""
    if explicit:
        return [validate_endpoint(u) for u in explicit], "argument"
    e = envvars.s3_endpoint_vars(env)
    if e.uris:
        raw = [u for u in e.uris.split(",") if u.strip()]
        return [validate_endpoint(u, "S3_ENDPOINT_URIS") for u in raw], "S3_ENDPOINT_URIS"
    if e.template:
        urls = expand_template(e.template)
        return [validate_endpoint(u, "S3_ENDPOINT_TEMPLATE") for u in urls], "S3_ENDPOINT_TEMPLATE"
    if e.file:
        path = Path(e.file)
        try:
            lines = path.read_text().splitlines()
        except OSError as exc:
            raise ConfigError(f"S3_ENDPOINT_FILE {str(path)!r}: {exc.strerror or exc}") from None
        urls = [ln.split("#", 1)[0].strip() for ln in lines]
        found = [validate_endpoint(u, f"S3_ENDPOINT_FILE {str(path)!r}") for u in urls if u]
        if not found:
            raise ConfigError(f"S3_ENDPOINT_FILE {str(path)!r} lists no endpoints")
        return found, "S3_ENDPOINT_FILE"
    if e.aws_endpoint_url:
        return [validate_endpoint(e.aws_endpoint_url, "AWS_ENDPOINT_URL")], "AWS_ENDPOINT_URL"
    return [], "none"


def strategy_from_env(env: Mapping[str, str] | None = None) -> modes.LoadBalanceStrategy:
    """``S3_LOAD_BALANCE_STRATEGY`` validated; ``round_robin`` when unset."""
    return envvars.load_balance_strategy(env) or "round_robin"


def rank_endpoint(rank: int, env: Mapping[str, str] | None = None) -> str | None:
    """The endpoint pinned to ``rank`` (``rank % N``) when the strategy is ``rank``, else None.

    For backends that take one endpoint per client (minio, s3torchconnector, s3dlio's
    single-endpoint mode): each MPI rank talks to its own front end.
    """
    if strategy_from_env(env) != "rank":
        return None
    urls, _ = endpoints_from_env(None, env)
    return urls[rank % len(urls)] if urls else None


def is_failover_error(exc: BaseException) -> bool:
    """True when ``exc`` (or what caused it) says the endpoint is unreachable or timed out."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, (ConnectionRefusedError, ConnectionResetError, TimeoutError)):
            return True
        if isinstance(cur, OSError) and cur.errno in _FAILOVER_ERRNOS:
            return True
        if any(cls.__name__ in _FAILOVER_NAMES for cls in type(cur).__mro__):
            return True
        cur = cur.__cause__ or cur.__context__
    return False


# -- routing ------------------------------------------------------------------------------
@dataclass
class EndpointStats:
    """What one endpoint did. ``errors``: failed attempts; ``retries``: attempts it took over."""

    endpoint: str
    bytes: int = 0
    parts: int = 0
    in_flight: int = 0
    in_flight_peak: int = 0
    errors: int = 0
    retries: int = 0
    marked_down: int = 0
    latencies_s: list[float] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        p = percentiles(self.latencies_s)
        return {
            "endpoint": self.endpoint,
            "bytes": self.bytes,
            "parts": self.parts,
            "in_flight_peak": self.in_flight_peak,
            "errors": self.errors,
            "retries": self.retries,
            "marked_down": self.marked_down,
            "latency_p50_s": p.p50,
            "latency_p99_s": p.p99,
        }


class EndpointRouter:
    """Picks an endpoint per request, tracks in-flight counts, fails over, keeps statistics.

    Used from one event loop (no locks needed: all bookkeeping happens between awaits).
    """

    def __init__(
        self,
        endpoints: Sequence[str],
        strategy: str = "round_robin",
        *,
        rank: int = 0,
        down_for_s: float = 5.0,
        max_attempts: int | None = None,
    ) -> None:
        if not endpoints:
            raise ConfigError(
                "no S3 endpoints: set S3_ENDPOINT_URIS, S3_ENDPOINT_TEMPLATE, "
                "S3_ENDPOINT_FILE or AWS_ENDPOINT_URL, or pass endpoints"
            )
        checked: modes.LoadBalanceStrategy = modes.parse(
            "load-balance strategy", strategy, modes.LoadBalanceStrategy, fold=False
        )
        if down_for_s < 0:
            raise ConfigError(f"down_for_s must be >= 0, got {down_for_s!r}")
        self.endpoints = [validate_endpoint(u) for u in endpoints]
        self.strategy = checked
        self.rank = rank
        self.down_for_s = down_for_s
        self.max_attempts = max_attempts or len(self.endpoints) + 1
        self._stats = {u: EndpointStats(u) for u in self.endpoints}
        self._down_until = dict.fromkeys(self.endpoints, 0.0)
        self._next = rank % len(self.endpoints) if strategy == "rank" else 0

    @classmethod
    def from_env(
        cls,
        explicit: Sequence[str] | None = None,
        strategy: str | None = None,
        *,
        rank: int | None = None,
        env: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> EndpointRouter:
        """Endpoints and strategy from arguments, else the environment; rank from MPI."""
        e = envvars.environ(env)
        urls, _ = endpoints_from_env(explicit, e)
        chosen = strategy or strategy_from_env(e)
        r = rank_info_from_env(e).rank if rank is None else rank
        return cls(urls, chosen, rank=r, **kwargs)

    def _healthy(self, url: str, now: float) -> bool:
        return self._down_until[url] <= now

    def pick(self) -> str:
        """The endpoint for the next request (down ones skipped while any is up)."""
        now, n = time.monotonic(), len(self.endpoints)
        order = [self.endpoints[(self._next + i) % n] for i in range(n)]
        up = [u for u in order if self._healthy(u, now)]
        if not up:  # all down: try the one that comes back first rather than fail outright
            return min(self.endpoints, key=self._down_until.__getitem__)
        if self.strategy == "least_connections":
            choice = min(up, key=lambda u: self._stats[u].in_flight)  # ties: rotation order
        else:
            choice = up[0]
        if self.strategy != "rank":
            self._next = (self.endpoints.index(choice) + 1) % n
        return choice

    def control_order(self) -> list[str]:
        """Where one-off requests (create/complete/abort/HEAD) go, in order: the home endpoint
        (the rank's for ``rank``, else the first), then the others; endpoints marked down last.
        Not counted in the statistics, which describe the data path."""
        now, n = time.monotonic(), len(self.endpoints)
        home = self.rank % n if self.strategy == "rank" else 0
        order = [self.endpoints[(home + i) % n] for i in range(n)]
        return sorted(order, key=lambda u: not self._healthy(u, now))  # stable: up first

    def mark_down(self, url: str) -> None:
        self._down_until[url] = time.monotonic() + self.down_for_s
        self._stats[url].marked_down += 1

    @asynccontextmanager
    async def endpoint(self, nbytes: int = 0, *, retry: bool = False) -> AsyncIterator[str]:
        """One attempt on a chosen endpoint; unreachable → marked down, exception re-raised."""
        url = self.pick()
        st = self._stats[url]
        st.in_flight += 1
        st.in_flight_peak = max(st.in_flight_peak, st.in_flight)
        st.retries += int(retry)
        t0 = time.perf_counter()
        try:
            yield url
        except Exception as exc:
            st.errors += 1
            if is_failover_error(exc):
                self.mark_down(url)
            raise
        else:
            st.parts += 1
            st.bytes += nbytes
            st.latencies_s.append(time.perf_counter() - t0)
        finally:
            st.in_flight -= 1

    async def call(
        self,
        fn: Callable[[str], Awaitable[T]],
        nbytes: int = 0,
        *,
        retry_on: Callable[[BaseException], bool] | None = None,
    ) -> T:
        """``await fn(endpoint)``, retried on another endpoint when one is unreachable, or when
        ``retry_on(exc)`` says so (e.g. 503 SlowDown: retried elsewhere, endpoint not marked down)."""
        for attempt in range(self.max_attempts):
            try:
                async with self.endpoint(nbytes, retry=attempt > 0) as url:
                    return await fn(url)
            except Exception as exc:
                again = is_failover_error(exc) or (retry_on is not None and retry_on(exc))
                if not again or attempt + 1 >= self.max_attempts:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def stats(self) -> dict[str, Any]:
        """Plain data: strategy, total retries, and per-endpoint figures."""
        per = [s.to_dict() for s in self._stats.values()]
        return {"strategy": self.strategy, "retries": sum(s["retries"] for s in per), "endpoints": per}
