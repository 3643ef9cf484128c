"""A local OAuth 2.0 token endpoint for service-account keys (the part of Google's that a
service-account JWT grant talks to), for tests of the ``gcs`` backend's key exchange.

:class:`TokenServer` runs the standard library's HTTP server in a thread on 127.0.0.1 (a free
port). Each ``POST`` must be a JWT-bearer grant whose assertion is RS256-signed by the key pair
the test generated (:func:`key_pair`, checked with cryptography against its public key) and
names the account, an audience (Google's token endpoint, which google-auth signs in whatever
the ``token_uri``) and the devstorage scope; then it answers
``{"access_token": "ya29.local-N-...", "expires_in": server.expires_in}``. ``refuse`` answers
``400 invalid_grant`` instead (a deleted key). Every grant checked is recorded (``grants``);
a grant that fails a check is answered 400 and recorded in ``bad``.
"""

from __future__ import annotations

import base64
import http.server
import json
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

GRANT_TYPE = "urn:ietf:params:oauth:grant-type:jwt-bearer"
SCOPE = "https://www.googleapis.com/auth/devstorage.read_write"
#: the audience google-auth signs into a service account's assertion, whatever the token_uri
GOOGLE_AUDIENCE = "https://oauth2.googleapis.com/token"


@dataclass(frozen=True)
class KeyPair:
    private_pem: str  # PKCS#8, as Google's key files hold it
    public_key: rsa.RSAPublicKey

    def body_lines(self) -> list[str]:
        """The PEM's base64 lines: none may appear in any output."""
        return [line for line in self.private_pem.splitlines() if line and not line.startswith("-----")]


def key_pair() -> KeyPair:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    return KeyPair(pem, key.public_key())


def _b64(part: str) -> bytes:
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


@dataclass
class Grant:
    grant_type: str
    claims: dict[str, Any] = field(default_factory=dict)
    issued: str = ""  # the access token answered ("" when refused)


class _Handler(http.server.BaseHTTPRequestHandler):
    server: TokenHTTPServer

    def do_POST(self) -> None:
        owner = self.server.owner
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
        form = {k: v[0] for k, v in parse_qs(body).items()}
        grant = Grant(form.get("grant_type", ""))
        problem = owner.check(form, grant)
        with owner.lock:
            owner.grants.append(grant)
            if problem:
                owner.bad.append(problem)
            elif owner.refuse:
                problem = "refused"
            else:
                owner.count += 1
                grant.issued = f"ya29.local-{owner.count}-{uuid.uuid4().hex}"
        if problem:
            answer: dict[str, Any] = {"error": "invalid_grant", "error_description": "Invalid JWT Signature."}
            self._send(400, answer)
        else:
            self._send(
                200, {"access_token": grant.issued, "expires_in": owner.expires_in, "token_type": "Bearer"}
            )

    def _send(self, status: int, answer: dict[str, Any]) -> None:
        payload = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: object) -> None:
        pass


class TokenHTTPServer(http.server.ThreadingHTTPServer):
    owner: TokenServer


class TokenServer:
    """The token endpoint, started and stopped by the caller (``with TokenServer(...) as t``)."""

    def __init__(self, keys: KeyPair, client_email: str, *, expires_in: int = 3600) -> None:
        self.keys, self.client_email, self.expires_in = keys, client_email, expires_in
        self.refuse = False
        self.lock = threading.Lock()
        self.grants: list[Grant] = []
        self.bad: list[str] = []
        self.count = 0
        self.httpd = TokenHTTPServer(("127.0.0.1", 0), _Handler)
        self.httpd.owner = self
        self.uri = f"http://127.0.0.1:{self.httpd.server_port}/token"
        self._thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)

    def __enter__(self) -> TokenServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self._thread.join()
        self.httpd.server_close()

    @property
    def issued(self) -> list[str]:
        with self.lock:
            return [g.issued for g in self.grants if g.issued]

    def key_info(self) -> dict[str, str]:
        """A service-account key file's fields, its token_uri this endpoint."""
        return {
            "type": "service_account",
            "project_id": "asyncckpt-test",
            "private_key_id": uuid.uuid4().hex,
            "private_key": self.keys.private_pem,
            "client_email": self.client_email,
            "client_id": "1234567890",
            "token_uri": self.uri,
        }

    def check(self, form: dict[str, str], grant: Grant) -> str:
        """What is wrong with the grant ("" when nothing): type, RS256 signature, claims."""
        if form.get("grant_type") != GRANT_TYPE:
            return f"grant_type {form.get('grant_type')!r}"
        try:
            head, claims, signature = form["assertion"].split(".")
            header = json.loads(_b64(head))
            grant.claims = json.loads(_b64(claims))
            self.keys.public_key.verify(
                _b64(signature), f"{head}.{claims}".encode(), padding.PKCS1v15(), hashes.SHA256()
            )
        except (KeyError, ValueError, InvalidSignature) as exc:
            return f"assertion: {type(exc).__name__}"
        if header.get("alg") != "RS256":
            return f"alg {header.get('alg')!r}"
        c = grant.claims
        if (
            c.get("iss") != self.client_email
            or c.get("aud") not in (self.uri, GOOGLE_AUDIENCE)
            or SCOPE not in str(c.get("scope"))
        ):
            return f"claims {c!r}"
        return ""
