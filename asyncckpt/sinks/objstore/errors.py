"""One error boundary for every object store: what a client library's exception says, read
into :class:`ErrorFields`, becomes an asyncckpt error by :func:`classify`.

The algorithm (unavailable, then unreachable, missing, denied) is the same for every store;
what differs is each store's vocabulary of error codes and hints (:class:`ErrorVocabulary`:
S3's ``NoSuchKey``, Azure's ``BlobNotFound``, ...), which a store's sink class names.
"""

from __future__ import annotations

import errno
import re
from dataclasses import dataclass
from functools import cached_property

from ...errors import StorageError, StoragePermissionError, TargetNotFoundError


@dataclass(frozen=True)
class ErrorFields:
    """What a client library's exception says, in a store's terms (each backend reads its own)."""

    code: str = ""  # the store's error code ("NoSuchKey"), or "" when the library does not give one
    message: str = ""  # the text shown to the user (code and server message, no secrets)
    status: int | None = None  # the HTTP status, when known
    unreachable: bool = False  # no answer at all: refused, reset, name resolution, connect timeout


def whole_words(codes: tuple[str, ...]) -> re.Pattern[str] | None:
    """A pattern matching any of ``codes`` as a whole word ("404" inside a bucket name or request
    id, "t-96f7ea404ee…", is no status); None when there are none."""
    return re.compile(r"\b(?:" + "|".join(map(re.escape, codes)) + r")\b") if codes else None


@dataclass(frozen=True)
class ErrorVocabulary:
    """A store's error codes and hints. Empty: statuses only (404, 403, 503)."""

    not_found: tuple[str, ...] = ()  # codes meaning "no such object / container"
    denied: tuple[str, ...] = ()  # codes meaning "not allowed" (credentials, policy)
    unavailable: tuple[str, ...] = ()  # substrings of a code or message meaning 503 / throttling
    unavailable_hint: str = " (the server answered 503 Service Unavailable after retries)"
    denied_hint: str = ""  # where credentials come from

    @cached_property
    def not_found_re(self) -> re.Pattern[str] | None:
        return whole_words(self.not_found)

    @cached_property
    def denied_re(self) -> re.Pattern[str] | None:
        return whole_words(self.denied)


_XML_DECLARATION = re.compile(r"<\?xml[^>]*\?>")
#: lines of a server's message that name the request, not the error (Azure's ``RequestId:``
#: and ``Time:``, after its message, inside the XML body)
_REQUEST_LINES = ("RequestId:", "Time:")


def one_line(text: str) -> str:
    """A store's message as one line with its useful part: without Azure's ``RequestId:`` and
    ``Time:`` lines and an XML declaration, the rest joined by spaces."""
    text = _XML_DECLARATION.sub("", text)
    lines = [line.strip() for line in text.splitlines()]
    kept = " ".join(line for line in lines if line and not line.startswith(_REQUEST_LINES))
    return kept.rstrip(": ")


def matches(pattern: re.Pattern[str] | None, text: str) -> bool:
    return pattern is not None and pattern.search(text) is not None


def classify(fields: ErrorFields, what: str, vocabulary: ErrorVocabulary) -> StorageError:
    """The asyncckpt error for what a library said: unavailable (503), missing (404), denied
    (403), unreachable, else a plain storage error. Codes match as whole words only."""
    message = one_line(fields.message)
    text = f"{what}: {message or fields.code or 'no message'}"
    if fields.unreachable:
        text = f"{what}: cannot reach the endpoint ({message})"
    code = fields.code or ("" if fields.status is None else str(fields.status))
    v = vocabulary
    if fields.status == 503 or any(m in code or m in fields.message for m in v.unavailable):
        return StorageError(errno.EIO, text + v.unavailable_hint)
    if fields.unreachable:
        return StorageError(errno.EIO, text)
    if fields.status == 404 or matches(v.not_found_re, code):
        return TargetNotFoundError(errno.ENOENT, text)
    if fields.status == 403 or matches(v.denied_re, code):
        return StoragePermissionError(errno.EACCES, text + v.denied_hint)
    return StorageError(errno.EIO, text)
