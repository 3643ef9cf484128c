"""JSON of documents that grow with the tensors (a state's tree, a step index), made and read
so that a worker thread doing it lets the event loop's thread run.

CPython's C encoder and decoder hold the GIL for a whole document: encoding the 9 MB step
index of 80 000 tensors in a worker thread stopped the loop's thread for 0.29-0.41 s, as surely
as if the loop did the work itself (docs/benchmarks.md, many small tensors). Here the C encoder
makes parts of at most ``SMALL`` members and Python joins them, and the decoder builds every
object through a Python hook; the interpreter hands the GIL over at those points every
``sys.getswitchinterval()`` (5 ms). The text is exactly ``json.dumps``'s with the same options.
"""

from __future__ import annotations

import json
from typing import Any

#: containers of at most this many members, all told, are made by the C encoder in one call
#: (tens of microseconds); larger ones member by member
SMALL = 1024


def _small(o: Any) -> bool:
    """Whether ``o`` holds at most ``SMALL`` members at every depth (stops counting there)."""
    left, stack = SMALL, [o]
    while stack:
        c = stack.pop()
        members = c.values() if isinstance(c, dict) else c
        left -= len(members)
        if left < 0:
            return False
        stack.extend(v for v in members if isinstance(v, (dict, list, tuple)))
    return True


def dumps(obj: Any, *, sort_keys: bool = False, separators: tuple[str, str] | None = None) -> str:
    """``json.dumps(obj, sort_keys=..., separators=...)``, returning to Python between its
    parts of at most ``SMALL`` members; dict keys must be strings (as in every document here)."""
    item, key = separators or (", ", ": ")

    def enc(o: Any) -> str:
        if (
            not isinstance(o, (dict, list, tuple))
            or _small(o)
            or (isinstance(o, dict) and not all(isinstance(k, str) for k in o))
        ):  # keys other than strings: json's own conversion, in one call
            return json.dumps(o, sort_keys=sort_keys, separators=separators)
        if isinstance(o, dict):
            pairs = sorted(o.items()) if sort_keys else o.items()
            return "{" + item.join(json.dumps(k) + key + enc(v) for k, v in pairs) + "}"
        return "[" + item.join(enc(v) for v in o) + "]"

    return enc(obj)


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    return dict(pairs)  # a Python frame per object: where the GIL can be handed over


def loads(text: str | bytes | bytearray) -> Any:
    """``json.loads(text)``, returning to Python at every object."""
    return json.loads(text, object_pairs_hook=_pairs)
