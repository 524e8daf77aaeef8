"""The report as a user sees it: opened in headless Chromium over HTTP, every table has body rows,
every figure is a decoded, non-blank image, every contents link lands on a section.

The check runs inside the page (a script the test server appends to index.html, not part of the
report): it reads each <img>'s decoded pixels through a canvas and writes its findings into the
DOM, which ``--dump-dom`` returns after load. A screenshot is checked for ink too.
"""

from __future__ import annotations

import functools
import http.server
import json
import re
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from flurka.reports import build_report

CHECK = """<script>
window.addEventListener('load', () => {
  const out = {tables: [], images: [], toc: [], missing: document.querySelectorAll('.missing').length};
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


@pytest.fixture(scope="module")
def served(report_dir):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Handler, directory=str(report_dir)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/index.html"
    server.shutdown()
    server.server_close()


def chromium(binary: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--disable-dev-shm-usage", "--hide-scrollbars", f"--user-data-dir={tmp_path / 'profile'}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=90, check=True)


def test_every_table_has_rows_and_every_figure_renders(report_dir, served, tmp_path, chromium_binary):
    dom = chromium(chromium_binary, tmp_path, "--virtual-time-budget=15000", "--run-all-compositor-stages-before-draw",
                   "--window-size=1280,2000", "--dump-dom", served).stdout
    found = re.search(r'<pre id="report-check">(.*?)</pre>', dom, re.S)
    assert found, "the page did not finish loading in Chromium"
    check = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&").replace("&lt;", "<")
                       .replace("&gt;", ">"))

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

    assert check["missing"] == 0  # the synthetic data fills every section
    assert len(check["toc"]) == 15 and all(link["found"] for link in check["toc"]), check["toc"]


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
    html = (report_dir / "index.html").read_text()
    captions = re.findall(r'<figure class="plot" id="([^"]+)">.*?<figcaption>(.*?)</figcaption>', html, re.S)
    assert len(captions) == len(list((report_dir / "figures").glob("*.png")))
    for key, caption in captions:
        assert f"Device: {device_name}" in caption or "Device: cpu" in caption, (key, caption)
        assert "Config:" in caption or "Sweep '" in caption, (key, caption)
