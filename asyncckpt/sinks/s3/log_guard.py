"""botocore's DEBUG logs print request headers, the session token among them: mask that field.

asyncckpt builds its own messages without secrets; botocore's are not ours to build, so its
two loggers that show signed requests (``botocore.endpoint``: the prepared request;
``botocore.auth``: the canonical request) get a filter that masks the *field*
``x-amz-security-token`` wherever it appears, whatever its value. The secret access key itself
never appears there (only the signature derived from it).
"""

from __future__ import annotations

import logging
import re

_TOKEN = re.compile(r"""(x-amz-security-token['"]?\s*[:=,]\s*b?['"]?)[^'"\s,}]+""", re.IGNORECASE)
LOGGERS = ("botocore.endpoint", "botocore.auth", "aiobotocore.endpoint")


class MaskSessionToken(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "security-token" in message.lower():
            record.msg, record.args = _TOKEN.sub(r"\1**********", message), None
        return True


_FILTER = MaskSessionToken()


def guard_botocore_logs() -> None:
    """Install the filter once (idempotent: a filter object is added at most once per logger)."""
    for name in LOGGERS:
        logging.getLogger(name).addFilter(_FILTER)
