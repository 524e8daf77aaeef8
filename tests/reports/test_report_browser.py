"""The report as a user sees it: opened in headless Chromium over HTTP, every table has body rows,
every figure is a decoded, non-blank image, every contents link lands on a section, and the
page leads with the main job's result: the up-training section (its table, then its α figure)
comes first, on the full data set and on the main job's database alone, where the sections it
cannot fill are one line each at the end.

The check runs inside the page (a script the test server appends to index.html, not part of the
report): it reads each <img>'s decoded pixels through a canvas and writes its findings into the
DOM, which ``--dump-dom`` returns after load. A screenshot is checked for ink too.
"""

from __future__ import annotations

import functools
import http.server
import json
import re
import threading
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from browser import chromium

from flurka.reports import build_report

CHECK = """<script>
window.addEventListener('load', () => {
  const out = {tables: [], images: [], toc: [], missing: [],
               sections: Array.from(document.querySelectorAll('main > section'), e => e.id)};
  const first = document.querySelector('main > section');
  out.first = first ? {id: first.id, items: Array.from(first.querySelectorAll('figure'), f => f.className + ' ' + f.id),
                       top: first.getBoundingClientRect().top + window.scrollY,
                       cells: Array.from(first.querySelectorAll('figure.table tbody td'), td => td.textContent)} : null;
  for (const li of document.querySelectorAll('.missing')) {
    const style = getComputedStyle(li);
    out.missing.push({id: li.id, tag: li.tagName, text: li.textContent, blocks: li.querySelectorAll('table, img, figure, p, div').length,
                      height: li.getBoundingClientRect().height, line: parseFloat(style.lineHeight) || 20});
  }
  for (const t of document.querySelectorAll('table')) {
    out.tables.push({id: t.closest('figure') ? t.closest('figure').id : null,
                     rows: t.querySelectorAll('tbody tr').length, cells: t.querySelectorAll('tbody td').length});
  }
  for (const img of document.querySelectorAll('img')) {
    const r = {src: img.getAttribute('src'), complete: img.complete, w: img.naturalWidth, h: img.naturalHeight,
               shown: img.getBoundingClientRect().width, std: 0, ink: 0};
    if (img.naturalWidth > 0) {
      const c = document.createElement('canvas');
      c.width = img.naturalWidth; c.height = img.naturalHeight;
      const ctx = c.getContext('2d');
      ctx.drawImage(img, 0, 0);
      const d = ctx.getImageData(0, 0, c.width, c.height).data;
      let n = 0, s = 0, s2 = 0, ink = 0;
      for (let i = 0; i < d.length; i += 4) {
        const y = 0.299 * d[i] + 0.587 * d[i + 1] + 0.114 * d[i + 2];
        n++; s += y; s2 += y * y; if (y < 200) ink++;
      }
      r.std = Math.sqrt(Math.max(s2 / n - (s / n) ** 2, 0)); r.ink = ink / n;
    }
    out.images.push(r);
  }
  for (const a of document.querySelectorAll('nav a')) {
    const id = a.getAttribute('href').slice(1);
    out.toc.push({id: id, found: !!document.getElementById(id)});
  }
  const pre = document.createElement('pre');
  pre.id = 'report-check'; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


class _Handler(http.server.SimpleHTTPRequestHandler):
    """Serves the report directory; index.html gets the check script before </body>."""

    def do_GET(self):
        if self.path.split("?")[0] in ("/", "/index.html"):
            page = (Path(self.directory) / "index.html").read_text().replace("</body>", CHECK + "</body>")
            body = page.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        super().do_GET()

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def report_dir(populated, tmp_path_factory):
    url, theory = populated
    out = tmp_path_factory.mktemp("report")
    build_report(url, out, theory=[theory])
    return out


def _serve(directory: Path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Handler, directory=str(directory)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/index.html"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def served(report_dir):
    yield from _serve(report_dir)


@pytest.fixture(scope="module")
def main_job_served(main_job, tmp_path_factory):
    out = tmp_path_factory.mktemp("main-job-report")
    build_report(main_job, out)
    yield from _serve(out)


def page_check(binary: str, tmp_path: Path, url: str) -> dict:
    """The check script's findings on the page at ``url``, loaded in headless Chromium."""
    dom = chromium(binary, tmp_path, "--virtual-time-budget=15000", "--run-all-compositor-stages-before-draw",
                   "--window-size=1280,2000", "--dump-dom", url).stdout
    found = re.search(r'<pre id="report-check">(.*?)</pre>', dom, re.S)
    assert found, "the page did not finish loading in Chromium"
    return json.loads(found.group(1).replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">")
                      .replace("&amp;", "&"))


def test_every_table_has_rows_and_every_figure_renders(report_dir, served, tmp_path, chromium_binary):
    check = page_check(chromium_binary, tmp_path, served)

    pngs = sorted(p.name for p in (report_dir / "figures").glob("*.png"))
    assert len(pngs) >= 9, pngs  # one per populated figure kind at least
    assert sorted(Path(i["src"]).name for i in check["images"]) == pngs
    for img in check["images"]:
        assert img["complete"] and img["w"] > 300 and img["h"] > 200, img
        assert img["shown"] > 300, img  # laid out on the page, not collapsed
        assert img["std"] > 10 and img["ink"] > 0.01, f"blank figure {img}"

    tables = {t["id"]: t for t in check["tables"]}
    on_disk = sorted(p.stem for p in (report_dir / "tables").glob("*.csv"))
    assert sorted(tables) == on_disk
    for t in check["tables"]:
        assert t["rows"] >= 1 and t["cells"] >= t["rows"], t

    assert check["missing"] == []  # the synthetic data fills every section
    assert len(check["toc"]) == 15 and all(link["found"] for link in check["toc"]), check["toc"]
    assert check["sections"][:2] == ["uptraining", "isoflops"], check["sections"]
    assert check["first"]["items"][:3] == ["table cells uptraining-nmt-wmt14-ende", "plot uptraining-nmt-wmt14-ende-fig",
                                           "table prose uptraining-nmt-wmt14-ende-observations"]


def test_screenshot_shows_the_report(served, tmp_path, chromium_binary):
    shot = tmp_path / "report.png"
    chromium(chromium_binary, tmp_path, "--virtual-time-budget=15000", "--window-size=1280,2400", f"--screenshot={shot}", served)
    pixels = np.asarray(Image.open(shot).convert("L"), dtype=float)
    assert pixels.shape == (2400, 1280)
    assert pixels.std() > 20
    # The first figure sits in the top 2400 px: some 400-px band there is mostly drawn, not text.
    bands = [(pixels[y:y + 400] < 200).mean() for y in range(0, 2000, 100)]
    assert max(bands) > 0.04, bands


def test_captions_name_device_and_config(report_dir, device_name):
    """Every figure's device and configuration are named: in its caption, or in the caption of an
    item before it from the same sweeps (which the page does not repeat)."""
    html = (report_dir / "index.html").read_text()
    captions = re.findall(r'<figure class="([^"]+)" id="([^"]+)">.*?<figcaption>(.*?)</figcaption>', html, re.S)
    plots = [key for kind, key, _ in captions if kind == "plot"]
    assert len(plots) == len(list((report_dir / "figures").glob("*.png")))
    named = None
    for kind, key, caption in captions:
        if caption.startswith("Device: "):
            named = caption
        if kind == "plot":
            assert named and (f"Device: {device_name}" in named or "Device: cpu" in named), (key, named)
            assert "Config:" in named or "Sweep '" in named, (key, named)


def test_main_job_report_names_its_sweep_once(main_job, tmp_path):
    """Issue 59: one ~70-word caption ("Device: cpu x1. Config: sweep 'uptrain-small'…") stood under
    the up-training table, its figure and both observation tables. The main job's report names
    its one sweep once, in its first caption, and no caption repeats another (HTML and Markdown)."""
    index = build_report(main_job, tmp_path / "report")
    captions = re.findall(r"<figcaption>(.*?)</figcaption>", index.read_text(), re.S)
    assert len(captions) >= 5
    assert captions[0].startswith("Device: ") and sum("Device: " in c for c in captions) == 1, captions
    assert len(set(captions)) == len(captions), captions
    assert (tmp_path / "report" / "report.md").read_text().count("Device: ") == 1


def test_main_job_report_leads_with_uptraining(main_job_served, tmp_path, chromium_binary):
    """The main job's database alone: in the browser the first section is up-training, its
    table's cells are "mean ± CI (n=3)", its α figure is the page's first image and is drawn;
    loss vs FLOPs follows; the 13 sections it cannot fill are one line each at the end (a list
    item one line high at 1280 px, two where its command is longer than the column), each
    naming its section and the command that fills it."""
    check = page_check(chromium_binary, tmp_path, main_job_served)
    assert check["sections"] == ["uptraining", "isoflops", "not-filled"]
    first = check["first"]
    assert first["id"] == "uptraining" and first["items"] == [
        "table cells uptraining-nmt-small", "plot uptraining-nmt-small-fig", "table prose uptraining-nmt-small-observations",
        "table cells uptraining-nmt-small-observations-rows", "table cells uptraining-nmt-small-loss",
        "table cells uptraining-quality"]
    ci_cells = [c for c in first["cells"] if re.fullmatch(r"\d+\.\d ± \d+\.\d \(n=3\)( \*)?", c)]
    # BLEU cells: Table 5's 4 rows (variant, d_k) × kernel, low-rank, 4 α; the quality table's 7 mechanisms
    assert len(ci_cells) == 4 * 6 + 7, first["cells"]
    loss_cells = [c for c in first["cells"] if re.fullmatch(r"0\.\d{3} ± 0\.\d{3} \(n=3\)( \*)?", c)]
    assert len(loss_cells) == 4 * 6, first["cells"]         # Table 5 on the eval loss, the sweep's table
    assert sum(c.endswith(" *") for c in ci_cells) == 4      # each row's best α
    assert Path(check["images"][0]["src"]).name == "uptraining-nmt-small-fig.png"
    assert all(img["complete"] and img["std"] > 10 and img["ink"] > 0.01 for img in check["images"]), check["images"]
    assert len(check["images"]) == 2
    missing = check["missing"]
    assert [m["id"] for m in missing] == ["speed-n", "speed-dk", "speed-dmodel", "speedups", "floor", "glue", "lra",
                                          "lra-small", "collective", "approximation-error", "rank", "flops", "profiles"]
    for m in missing:
        assert m["tag"] == "LI" and m["blocks"] == 0, m
        title, _, command = m["text"].partition(": run ")
        assert title and command.startswith(("python -m flurka.speed", "python -m flurka.theory", "python experiments/uptrain_sweep.py")), m
        # one line at 1280 px; a command longer than the column wraps once
        assert m["height"] < (1.5 if len(m["text"]) <= 150 else 2.5) * m["line"], m
    assert [t["id"] for t in check["toc"]] == ["uptraining", "isoflops", "not-filled"]
    assert all(t["found"] for t in check["toc"])
