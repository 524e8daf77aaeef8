"""Writing the sections out: ``index.html`` (static, images beside it), ``report.md``, and every
table as Markdown, LaTeX and CSV under ``tables/`` (``tables.tex`` collects the LaTeX tables with
their captions, ready to ``\\input``).

The sections with items come first, in their order; those this database cannot fill follow as
one list, "Not in this database", a line each: the section's title and the command that fills
it (each line keeps its section's id, so a link to the section lands on it).

Table text comes from ``flurka.results.tables.format_table``; the HTML cells use the same number
format (the table's ``attrs["floatfmt"]``, else two decimals, "--" for a missing cell).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import html
import os
import re
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import pandas as pd

from flurka.reports import figures as F
from flurka.reports.sections import Plot, Section, Table
from flurka.results.tables import format_table

CSS = """
body { font: 15px/1.5 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1d1d1f; margin: 0; background: #fafafa; }
main { max-width: 1240px; margin: 0 auto; padding: 24px 32px 64px; background: #fff; }
h1 { font-size: 28px; margin: 8px 0 4px; } h2 { font-size: 21px; margin-top: 40px; border-bottom: 1px solid #ddd; }
h3 { font-size: 16px; margin: 22px 0 6px; } .meta, .about { color: #555; } .about { margin-top: -4px; }
nav ol { columns: 2; padding-left: 20px; } nav a { text-decoration: none; color: #1f5fbf; }
#not-filled ul { list-style: none; padding: 0; margin: 8px 0; } .missing { font-size: 13px; padding: 2px 0; color: #444; }
.missing code { font-size: 12px; background: #f4f4f4; padding: 1px 4px; border-radius: 3px; }
figure { margin: 12px 0 22px; } figcaption { font-size: 13px; color: #444; margin: 4px 0 8px; }
img { max-width: 100%; border: 1px solid #eee; }
table { border-collapse: collapse; font-size: 13px; font-variant-numeric: tabular-nums; }
th, td { padding: 3px 10px; text-align: right; border-bottom: 1px solid #eee; }
th { border-bottom: 2px solid #999; } tbody tr:hover { background: #f3f7ff; }
td:first-child, th:first-child { text-align: left; } .links { font-size: 12px; }
figure.table { overflow-x: auto; } figure.cells td { white-space: nowrap; }
figure.cells th, figure.cells td { padding: 3px 6px; font-size: 12px; }
figure.prose td { text-align: left; vertical-align: top; }
"""


def cells(df: pd.DataFrame) -> pd.DataFrame:
    """The table flattened (index as columns) with every cell formatted as text."""
    fmt = df.attrs.get("floatfmt", ".2f")
    flat = df.reset_index()
    return flat.map(lambda v: "--" if v is None or (isinstance(v, float) and v != v)
                    else format(v, fmt) if isinstance(v, float) else str(v))


def _tex_escape(text: str) -> str:
    return re.sub(r"([&%$#_{}])", r"\\\1", text).replace("~", r"\textasciitilde{}").replace("^", r"\^{}")


def captions(sections: Sequence[Section]) -> dict[str, str]:
    """Each item's caption as the page shows it: its provenance (device, sweep, commit) before it
    where that differs from the item before, so a report of one sweep names it once, at its first
    item, not in every caption."""
    shown, last = {}, None
    for item in (i for s in sections for i in s.items):
        new = item.provenance and item.provenance != last
        shown[item.key] = f"{item.provenance}. {item.caption}" if new else item.caption
        last = item.provenance or last
    return shown


def _table_html(t: Table, caption: str) -> str:
    body = cells(t.df).to_html(index=False, border=0, escape=True)
    links = " · ".join(f'<a href="tables/{t.key}.{ext}">{name}</a>'
                       for ext, name in (("md", "Markdown"), ("tex", "LaTeX"), ("csv", "CSV")))
    kind = " ".join(["table", *t.df.attrs.get("html_class", "").split()])
    return (f'<figure class="{kind}" id="{t.key}"><h3>{html.escape(t.title)}</h3>'
            f"<figcaption>{html.escape(caption)}</figcaption>{body}"
            f'<div class="links">{links}</div></figure>')


def _plot_html(p: Plot, caption: str) -> str:
    return (f'<figure class="plot" id="{p.key}"><h3>{html.escape(p.title)}</h3>'
            f'<img src="figures/{p.key}.png" alt="{html.escape(p.title)}">'
            f"<figcaption>{html.escape(caption)}</figcaption></figure>")


NOT_FILLED = ("not-filled", "Not in this database")


def filled(sections: Sequence[Section]) -> tuple[list[Section], list[Section]]:
    """(sections with items, sections this database cannot fill), each in the given order."""
    return [s for s in sections if not s.missing], [s for s in sections if s.missing]


def _section_html(s: Section, shown: dict[str, str]) -> str:
    parts = [f'<section id="{s.key}"><h2>{html.escape(s.title)}</h2><p class="about">{html.escape(s.about)}</p>']
    parts += [(_table_html if isinstance(i, Table) else _plot_html)(i, shown[i.key]) for i in s.items]
    return "".join(parts) + "</section>"


def _missing_html(missing: Sequence[Section]) -> str:
    if not missing:
        return ""
    lines = "".join(f'<li class="missing" id="{s.key}"><b>{html.escape(s.title)}</b>: run '
                    f"<code>{html.escape(s.missing)}</code></li>" for s in missing)
    return f'<section id="{NOT_FILLED[0]}"><h2>{NOT_FILLED[1]}</h2><ul>{lines}</ul></section>'


def page(sections: Sequence[Section], title: str, meta: str) -> str:
    shown, missing = filled(sections)
    toc = "".join(f'<li><a href="#{s.key}">{html.escape(s.title)}</a></li>' for s in shown)
    if missing:
        toc += f'<li><a href="#{NOT_FILLED[0]}">{NOT_FILLED[1]}</a> ({len(missing)} sections)</li>'
    caption = captions(shown)
    body = "".join(_section_html(s, caption) for s in shown) + _missing_html(missing)
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f'<meta name="viewport" content="width=device-width, initial-scale=1"><style>{CSS}</style></head>'
            f'<body><main><h1>{html.escape(title)}</h1><p class="meta">{html.escape(meta)}</p>'
            f'<nav><h2>Contents</h2><ol>{toc}</ol></nav>{body}</main></body></html>\n')


def markdown(sections: Sequence[Section], title: str, meta: str) -> str:
    shown, missing = filled(sections)
    out = [f"# {title}\n\n{meta}\n"]
    caption = captions(shown)
    for s in shown:
        out.append(f"\n## {s.title}\n\n{s.about}\n")
        for i in s.items:
            if isinstance(i, Table):
                out.append(f"\n### {i.title}\n\n{caption[i.key]}\n\n{format_table(i.df, 'markdown')}")
            else:
                out.append(f"\n### {i.title}\n\n![{i.title}](figures/{i.key}.png)\n\n{caption[i.key]}\n")
    if missing:
        out.append(f"\n## {NOT_FILLED[1]}\n\n" + "".join(f"- **{s.title}**: run `{s.missing}`\n" for s in missing))
    return "".join(out)


def standalone(item: Table | Plot) -> str:
    """The caption of an item shown alone (a LaTeX table, a file of its own): with its provenance."""
    return f"{item.provenance}. {item.caption}" if item.provenance else item.caption


def latex(tables: Sequence[Table]) -> str:
    return "".join(f"% {t.key}\n\\begin{{table}}[t]\n\\centering\n\\small\n{format_table(t.df, 'latex')}"
                   f"\\caption{{{_tex_escape(t.title)}. {_tex_escape(standalone(t))}}}\n\\label{{tab:{t.key}}}\n"
                   f"\\end{{table}}\n\n" for t in tables)


def write(sections: Sequence[Section], out_dir: str | Path, *, title: str, source: str) -> Path:
    """Write the report into ``out_dir`` (created; an earlier report's figures and tables there
    are removed first, so none goes stale); returns the path of ``index.html``.

    Whole or not at all: every file is written into a folder of its own inside ``out_dir`` first,
    then moved into place with SIGINT / SIGTERM held (renames: an earlier report is replaced at
    once, never left half old and half new). An exception or a signal before that leaves
    ``out_dir`` as it was (removed again if this call created it)."""
    out = Path(out_dir)
    meta = f"Generated {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M UTC} from {source}."
    items = [i for s in sections for i in s.items]
    keys = [i.key for i in items]
    if len(set(keys)) != len(keys):
        raise ValueError(f"report item keys repeat: {sorted({k for k in keys if keys.count(k) > 1})}")
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    staged = Path(tempfile.mkdtemp(prefix=".report-partial-", dir=out))
    try:
        (staged / "figures").mkdir()
        (staged / "tables").mkdir()
        for i in items:
            if isinstance(i, Table):
                for fmt, ext in (("markdown", "md"), ("latex", "tex"), ("csv", "csv")):
                    (staged / "tables" / f"{i.key}.{ext}").write_text(format_table(i.df, fmt))
            else:
                (staged / "figures" / f"{i.key}.png").write_bytes(F.png(i.fig))
        (staged / "tables.tex").write_text(latex([i for i in items if isinstance(i, Table)]))
        (staged / "report.md").write_text(markdown(sections, title, meta))
        (staged / "index.html").write_text(page(sections, title, meta))
    except BaseException:
        shutil.rmtree(out if created else staged, ignore_errors=True)
        raise
    try:
        with _signals_held():
            _move_into_place(staged, out)
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    return out / "index.html"


REPLACED = {"figures": ("*.png",), "tables": ("*.md", "*.tex", "*.csv")}


def _move_into_place(staged: Path, out: Path) -> None:
    """The staged report into ``out``: the earlier report's figures and tables removed, every new
    file renamed in (the same file system: no copy), ``index.html`` last."""
    for sub, patterns in REPLACED.items():
        (out / sub).mkdir(exist_ok=True)
        for old in [f for pattern in patterns for f in (out / sub).glob(pattern)]:
            old.unlink()
        for new in (staged / sub).iterdir():
            os.replace(new, out / sub / new.name)
    for name in ("tables.tex", "report.md", "index.html"):
        os.replace(staged / name, out / name)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """A SIGINT or SIGTERM that comes inside the block is delivered when it ends (to the handler
    it would have reached): a Ctrl-C there lands after the last rename, not between two. (Not a
    signal mask: that holds a signal back from one thread, and JAX's threads would take it.)"""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []
    previous = {s: signal.signal(s, lambda signum, _frame: came.append(signum))
                for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)
        if came:
            signal.raise_signal(came[0])
