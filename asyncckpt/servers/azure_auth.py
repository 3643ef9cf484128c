"""Azure Blob requests over the standard library: SharedKey signing and account SAS tokens.

The Azurite server (:mod:`.azurite`) needs a container before any client can write, and a
readiness check that proves authentication works; neither obstore nor s3dlio creates
containers, and s3dlio accepts no account key at all (only a SAS token, or Entra ID), so a SAS
is derived here from the key. The key only ever enters the HMAC.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import http.client
from collections.abc import Mapping
from email.utils import formatdate
from urllib.parse import quote, urlencode, urlsplit

from ..secrets import Secret

#: the REST version sent; Azurite accepts newer ones with --skipApiVersionCheck
API_VERSION = "2021-08-06"
#: the headers of SharedKey's string-to-sign, in its order (Content-Length "" when 0)
_SIGNED_HEADERS = (
    "content-encoding", "content-language", "content-length", "content-md5", "content-type", "date",
    "if-modified-since", "if-match", "if-none-match", "if-unmodified-since", "range",
)  # fmt: skip


def _sign(key: Secret, text: str) -> str:
    digest = hmac.new(base64.b64decode(key.reveal()), text.encode(), hashlib.sha256).digest()
    return base64.b64encode(digest).decode()


def shared_key_request(
    method: str,
    endpoint: str,
    path: str,
    *,
    account: str,
    key: Secret,
    query: Mapping[str, str] | None = None,
    body: bytes = b"",
    headers: Mapping[str, str] | None = None,
    timeout: float = 5.0,
) -> tuple[int, bytes]:
    """One SharedKey-signed Blob request; return (status, body).

    ``endpoint`` is the account URL (``http://127.0.0.1:PORT/devstoreaccount1`` path-style);
    ``path`` the part after it (``/container`` or ``/container/blob``).
    """
    url = urlsplit(endpoint)
    if url.scheme not in ("http", "https") or not url.hostname:
        raise ValueError(f"endpoint must look like http(s)://host[:port]/account, got {endpoint!r}")
    query = dict(query or {})
    hdrs = {"x-ms-date": formatdate(usegmt=True), "x-ms-version": API_VERSION}
    hdrs.update({k.lower(): v for k, v in (headers or {}).items()})
    if body:
        hdrs["content-length"] = str(len(body))
    full_path = quote(url.path.rstrip("/") + path, safe="/-_.~")
    canonical_headers = "".join(f"{k}:{v}\n" for k, v in sorted(hdrs.items()) if k.startswith("x-ms-"))
    resource = f"/{account}{full_path}" + "".join(f"\n{k.lower()}:{v}" for k, v in sorted(query.items()))
    to_sign = "\n".join([method, *(hdrs.get(h, "") for h in _SIGNED_HEADERS), canonical_headers + resource])
    hdrs["authorization"] = f"SharedKey {account}:{_sign(key, to_sign)}"
    conn_class = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
    conn = conn_class(url.hostname, url.port, timeout=timeout)
    try:
        conn.request(method, full_path + (f"?{urlencode(query)}" if query else ""), body=body, headers=hdrs)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def account_sas(
    account: str,
    key: Secret,
    *,
    permissions: str = "rwdlacup",
    expiry: str = "2099-01-01T00:00:00Z",
    protocols: str = "https,http",
) -> Secret:
    """An account SAS for the Blob service (all resource types), signed with ``key``.

    ``protocols`` must include ``http`` for an emulator on plain http.
    """
    fields = [account, permissions, "b", "sco", "", expiry, "", protocols, API_VERSION, "", ""]
    signature = _sign(key, "\n".join(fields))
    params = {"sv": API_VERSION, "ss": "b", "srt": "sco", "sp": permissions, "se": expiry, "spr": protocols}
    return Secret(urlencode({**params, "sig": signature}))
