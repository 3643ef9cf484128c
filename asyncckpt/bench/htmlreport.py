"""One self-contained HTML file per run: the text report, the run metadata and every plot
embedded as a base64 PNG. No scripts, no fonts, no stylesheet or image fetched from
anywhere, so it opens offline and can be mailed or attached to a ticket as is."""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Mapping, Sequence
from typing import Any

_STYLE = """
body { font-family: sans-serif; margin: 2em; color: #222; max-width: 1100px; }
pre { background: #f6f6f6; padding: 1em; overflow-x: auto; font-size: 12px; }
table { border-collapse: collapse; font-size: 13px; }
td, th { border: 1px solid #ccc; padding: 2px 8px; text-align: left; vertical-align: top; }
img { max-width: 100%; border: 1px solid #eee; margin: 0.5em 0 1.5em; }
.note { color: #666; }
"""


def _metadata_rows(doc: Mapping[str, Any]) -> list[tuple[str, str]]:
    rows = [(k, str(doc[k])) for k in ("schema_version", "created", "mode") if k in doc]
    if "command" in doc:
        rows.append(("command", " ".join(doc["command"])))
    if doc.get("mode") == "mpi":
        for key in ("world_size", "launcher", "rank_info_source", "target", "layout", "size_bytes_per_rank"):
            rows.append((key, str(doc.get(key))))
        rows.append(("nodes", ", ".join(f"{h} ({n})" for h, n in doc["nodes"].items())))
        return rows
    rows += [("target", str(doc.get("target"))), ("size_bytes", str(doc.get("size_bytes")))]
    if doc["results"]:
        meta = dict(doc["results"][0]["metadata"])
        extra = meta.pop("extra", {})
        rows += [(k, json.dumps(v) if isinstance(v, dict) else str(v)) for k, v in meta.items()]
        rows += [
            (f"extra.{k}", json.dumps(v) if isinstance(v, dict | list) else str(v)) for k, v in extra.items()
        ]
    return rows


def render_html(
    doc: Mapping[str, Any], text: str, pngs: Sequence[tuple[str, str, bytes]], notes: Sequence[str] = ()
) -> str:
    """The page: title, metadata table, text report, plots, and what could not be plotted."""
    esc = html.escape
    title = f"asyncckpt {doc.get('mode', '')} run" + (f", {doc['created']}" if "created" in doc else "")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{esc(title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{esc(title)}</h1>",
        "<h2>Results</h2>",
        f"<pre>{esc(text)}</pre>",
        "<h2>Plots</h2>",
    ]
    for stem, caption, data in pngs:
        b64 = base64.b64encode(data).decode("ascii")
        parts.append(f'<h3 id="{esc(stem)}">{esc(caption)}</h3>')
        parts.append(f'<img alt="{esc(caption)}" src="data:image/png;base64,{b64}">')
    parts += [f'<p class="note">{esc(n)}</p>' for n in notes]
    parts.append("<h2>Run metadata</h2><table>")
    parts += [f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in _metadata_rows(doc)]
    parts.append("</table></body></html>")
    return "\n".join(parts) + "\n"
