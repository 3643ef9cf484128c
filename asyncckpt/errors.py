"""One exception hierarchy, rooted in :class:`AsyncCkptError`.

Each error also inherits the builtin a caller would naturally catch (``ValueError`` for bad
input, ``OSError`` for storage faults, ...), so code that does not know asyncckpt still
handles it. Foreign exceptions (``OSError`` from the kernel, botocore errors, ...) are
mapped to these classes where they enter the library.
"""

from __future__ import annotations

import errno


class AsyncCkptError(Exception):
    """Base class of every error raised by asyncckpt."""


class ConfigError(AsyncCkptError, ValueError):
    """Invalid configuration or argument, detected before any I/O."""


class UnsupportedSchemeError(ConfigError):
    """The URI names a scheme no backend handles."""


class TargetExistsError(ConfigError, FileExistsError):
    """The bench was pointed at an existing object that is not an asyncckpt checkpoint."""


class MissingDependencyError(AsyncCkptError, ImportError):
    """An optional dependency is not installed; the message names the extra to install."""

    def __init__(self, package: str, extra: str, purpose: str) -> None:
        super().__init__(
            f"{purpose} needs the optional package {package!r}; "
            f"install it with: pip install 'asyncckpt[{extra}]'"
        )
        self.package = package
        self.extra = extra


class StorageError(AsyncCkptError, OSError):
    """A storage operation failed."""


class TargetNotFoundError(StorageError, FileNotFoundError):
    """The target (file, parent directory, bucket or object) does not exist."""


class StoragePermissionError(StorageError, PermissionError):
    """The storage refused access (file mode, credentials, bucket policy)."""


class NoSpaceError(StorageError):
    """The target ran out of space."""


class DirectIOError(StorageError):
    """Direct I/O was demanded but the file system refused it."""


class DirectIOUnavailableError(DirectIOError, ConfigError):
    """``direct://`` names a file system without direct I/O (a memory file system, or one that
    refuses O_DIRECT); found before any data is written, so it is also bad input."""


class WriterProcessError(AsyncCkptError, RuntimeError):
    """The isolated writer process died, stalled or failed."""


class SaveAbandonedError(AsyncCkptError, RuntimeError):
    """A background (``staging="host"``) save was abandoned before it finished: its event
    loop ended first. Nothing was published at its URI."""


class CollectiveError(AsyncCkptError, RuntimeError):
    """A collective failed in the transport (a peer died, a timeout, a broken connection)."""


class StallError(AsyncCkptError, TimeoutError):
    """Storage made no progress for ``stall_timeout`` seconds; ``stage`` names the stuck call
    (``open``, ``write part 3``, ``complete``, ``abort``, ``read at offset …``)."""

    def __init__(self, message: str, *, stage: str = "") -> None:
        super().__init__(message)
        self.stage = stage


class IntegrityError(AsyncCkptError, ValueError):
    """Data read back does not match what was written."""


class ManifestMissingError(IntegrityError):
    """The object has no manifest: its save never finished (or it was not written by us)."""


class UnverifiableError(IntegrityError):
    """Checksum verification was asked of an object saved without checksums (``integrity="none"``):
    nothing is known to be wrong with it, but nothing can be proven either."""


class ManifestError(IntegrityError):
    """The manifest is unreadable or does not describe this object (size, name)."""


class StateFormatError(IntegrityError):
    """A state object is not a valid safetensors file (or its asyncckpt metadata is malformed)."""


class SourceChangedError(IntegrityError):
    """The caller's data changed while it was being saved (its checksums differ from a pre-pass);
    ``offset``: the first byte of the first chunk that differs, when known."""

    def __init__(self, message: str, *, offset: int | None = None) -> None:
        super().__init__(message)
        self.offset = offset


class TruncatedError(IntegrityError):
    """The object is shorter than its manifest says (``offset``: first missing byte)."""

    def __init__(self, message: str, *, offset: int) -> None:
        super().__init__(message)
        self.offset = offset


class ChecksumMismatchError(IntegrityError):
    """Bytes differ from the manifest; ``chunk`` and ``offset`` (first bad byte, if known)."""

    def __init__(self, message: str, *, chunk: int, offset: int) -> None:
        super().__init__(message)
        self.chunk = chunk
        self.offset = offset


def map_os_error(exc: OSError, what: str) -> StorageError:
    """Map a kernel ``OSError`` to the matching :class:`StorageError` subclass.

    ``what`` describes the operation and its target, e.g. ``"write /ckpt/rank0.bin"``.
    """
    if isinstance(exc, StorageError):
        return exc
    detail = exc.strerror or str(exc)
    message = f"{what}: {detail}"  # str() of the error puts "[Errno N]" in front: once
    cls: type[StorageError]
    if exc.errno == errno.ENOENT:
        cls = TargetNotFoundError
    elif exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        cls = StoragePermissionError
    elif exc.errno in (errno.ENOSPC, errno.EDQUOT):
        cls = NoSpaceError
    else:
        cls = StorageError
    err = cls(exc.errno, message)
    err.__cause__ = exc
    return err


class PreemptedError(AsyncCkptError):
    """A preemption signal (or ``save_now``) stopped the training loop after its step was
    committed; ``step`` is that step, ``signum`` the signal (None: on demand)."""

    def __init__(self, message: str, *, step: int, signum: int | None) -> None:
        super().__init__(message)
        self.step = step
        self.signum = signum


class PreemptDeadlineError(PreemptedError, TimeoutError):
    """The preemption save did not commit its step within the deadline; the message says what
    was durable (this rank's object, the step, the latest committed step) and what was not."""


class StepNotCommittedError(AsyncCkptError, FileNotFoundError):
    """A step directory has no commit record: it was never completed on every rank."""
