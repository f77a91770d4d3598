"""The HTML page of `novaforge report`: one self-contained document, its style and its script.

Everything is inline (CSS, a few lines of JS, SVG), so the file opens anywhere without network
access; nothing refers to an external URL. Tables with class `sortable` sort on a header click
(numeric columns by each cell's `data-v`); a link to `#ir-<i>` opens that pass's IR; the
address `#selftest` sorts the kernel table by time, twice, and records the resulting order in
`body[data-selftest]` (the headless-browser test reads it); `body[data-ready]` is set once the
script ran.

Invariant: every text that comes from the program (names, IR, source lines) goes through
`html.escape`; the page never writes to the console.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from typing import Any

CSS = """
body { font-family: -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif; margin: 0; color: #222;
       background: #fafafa; }
header { background: #24323f; color: #fff; padding: 16px 28px; }
header h1 { margin: 0 0 4px 0; font-size: 22px; }
header .sub { color: #c9d3dc; font-size: 13px; }
main { padding: 8px 28px 40px 28px; max-width: 1500px; }
section { background: #fff; border: 1px solid #e2e2e2; border-radius: 6px; padding: 10px 18px 16px 18px;
          margin: 16px 0; }
h2 { font-size: 17px; margin: 8px 0 10px 0; }
nav a { margin-right: 14px; font-size: 13px; }
.cards { display: flex; flex-wrap: wrap; gap: 10px; }
.card { border: 1px solid #ddd; border-radius: 6px; padding: 8px 14px; min-width: 130px; background: #fdfdfd; }
.card .v { font-size: 20px; font-weight: 600; }
.card .k { font-size: 11px; color: #666; text-transform: uppercase; letter-spacing: .04em; }
table { border-collapse: collapse; font-size: 12.5px; }
th, td { padding: 3px 8px; border-bottom: 1px solid #eee; text-align: left; vertical-align: top; }
td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; }
table.sortable th { cursor: pointer; user-select: none; background: #f3f5f7; position: sticky; top: 0; }
table.sortable th[data-dir="asc"]::after { content: " ▲"; }
table.sortable th[data-dir="desc"]::after { content: " ▼"; }
tr:hover td { background: #f6f9fc; }
.ops { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 11px; color: #444; max-width: 420px; }
.sched { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 10.5px; color: #666; max-width: 360px; }
pre { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 11px; background: #f7f7f7; padding: 8px;
      overflow: auto; max-height: 600px; border: 1px solid #eee; }
details summary { cursor: pointer; font-size: 13px; padding: 3px 0; }
.scroll { overflow: auto; max-height: 760px; border: 1px solid #eee; }
.chip { display: inline-block; color: #fff; border-radius: 4px; padding: 1px 7px; font-size: 11px; margin-right: 4px; }
.note { color: #666; font-size: 12px; }
.plot svg { max-width: 100%; height: auto; }
.bad { color: #b3261e; }
.pair { display: flex; flex-wrap: wrap; gap: 16px; align-items: flex-start; }
.pair > section { margin: 0; }
.pair > section#graph { flex: 0 1 auto; max-width: 40%; }
.pair > section#graph .scroll { max-height: 1150px; }
.pair > .stack { flex: 1 1 560px; min-width: 0; display: flex; flex-direction: column; gap: 16px; }
.pair > .stack > section { margin: 0; }
.pair { margin: 16px 0; }
"""

JS = """
(function () {
  function cellValue(row, idx, numeric) {
    var c = row.cells[idx];
    var v = c.getAttribute('data-v');
    if (v === null) v = c.textContent;
    return numeric ? parseFloat(v) : v.toLowerCase();
  }
  function sortBy(th) {
    var table = th.closest('table');
    var idx = Array.prototype.indexOf.call(th.parentNode.children, th);
    var numeric = th.getAttribute('data-type') === 'num';
    var dir = th.getAttribute('data-dir') === 'desc' ? 'asc' : 'desc';
    Array.prototype.forEach.call(th.parentNode.children, function (h) { h.removeAttribute('data-dir'); });
    th.setAttribute('data-dir', dir);
    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      var x = cellValue(a, idx, numeric), y = cellValue(b, idx, numeric);
      var r = x < y ? -1 : (x > y ? 1 : 0);
      return dir === 'asc' ? r : -r;
    });
    rows.forEach(function (r) { body.appendChild(r); });
    return idx;
  }
  document.querySelectorAll('table.sortable th').forEach(function (th) {
    th.addEventListener('click', function () { sortBy(th); });
  });
  function openHash() {
    var el = location.hash ? document.getElementById(location.hash.slice(1)) : null;
    if (el && el.tagName === 'DETAILS') { el.open = true; }
  }
  window.addEventListener('hashchange', openHash);
  openHash();
  if (location.hash === '#selftest') {
    var th = document.querySelector('#kernel-table th[data-key="time"]');
    if (th) {
      sortBy(th);
      var idx = sortBy(th);
      var order = Array.prototype.map.call(document.querySelectorAll('#kernel-table tbody tr'),
                                           function (r) { return r.cells[idx].getAttribute('data-v'); });
      document.body.setAttribute('data-selftest', th.getAttribute('data-dir') + ':' + order.join(','));
    }
  }
  document.body.setAttribute('data-ready', '1');
})();
"""

Cell = Any  # str | (text, sort value) | (text, sort value, css class)


def cell(text: str, sort: float | str | None = None, cls: str = "", raw: bool = False) -> tuple:
    return (text, sort, cls, raw)


def table(headers: Sequence[tuple[str, str]], rows: Sequence[Sequence[Any]], *, table_id: str = "",
          sortable: bool = True, keys: Sequence[str] = ()) -> str:
    """`headers`: (title, "num" | "text"); cells: plain values or `cell(...)` tuples."""
    ident = f' id="{table_id}"' if table_id else ""
    cls = ' class="sortable"' if sortable else ""
    out = [f"<table{ident}{cls}><thead><tr>"]
    for i, (title, kind) in enumerate(headers):
        key = f' data-key="{keys[i]}"' if i < len(keys) and keys[i] else ""
        ncls = ' class="n"' if kind == "num" else ""
        out.append(f'<th data-type="{kind}"{key}{ncls}>{escape(title)}</th>')
    out.append("</tr></thead><tbody>")
    for row in rows:
        out.append("<tr>")
        for i, c in enumerate(row):
            text, sort, ccls, raw = c if isinstance(c, tuple) else (str(c), None, "", False)
            kind = headers[i][1] if i < len(headers) else "text"
            classes = " ".join(x for x in ("n" if kind == "num" else "", ccls) if x)
            attrs = (f' class="{classes}"' if classes else "") + (f' data-v="{escape(str(sort))}"'
                                                                  if sort is not None else "")
            out.append(f"<td{attrs}>{text if raw else escape(str(text))}</td>")
        out.append("</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def cards(items: Sequence[tuple[str, str]]) -> str:
    return '<div class="cards">' + "".join(
        f'<div class="card"><div class="v">{escape(v)}</div><div class="k">{escape(k)}</div></div>'
        for k, v in items) + "</div>"


def section(ident: str, title: str, body: str, note: str = "") -> str:
    n = f'<p class="note">{note}</p>' if note else ""
    return f'<section id="{ident}"><h2>{escape(title)}</h2>{n}{body}</section>'


def document(title: str, subtitle: str, sections: Sequence[tuple[str, str, str]], nav: bool = True) -> str:
    """`sections`: (id, title, html) in order."""
    links = "".join(f'<a href="#{i}">{escape(t)}</a>' for i, t, _ in sections)
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width\"><title>{escape(title)}</title>"
            f"<style>{CSS}</style></head><body><header><h1>{escape(title)}</h1>"
            f"<div class=\"sub\">{escape(subtitle)}</div></header><main>"
            + (f"<nav>{links}</nav>" if nav else "")
            + "".join(html for _, _, html in sections)
            + f"</main><script>{JS}</script></body></html>\n")
