"""The ``--html`` page in a real browser: headless Chromium loads it with no error, every image
decodes, and the screenshot shows the images' colours where the page puts them.

A copy of the page gets a small script first in its ``<head>`` (before the page's
Content-Security-Policy, so the policy does not block it) that records script errors, resources
that fail to load, CSP violations and ``console.error`` calls, and on ``load`` writes them with
every image's position into the DOM, which ``--dump-dom`` prints. The detector is tested on pages
broken on purpose. Skipped only where no Chromium binary is found (scripts/setup.sh installs
Debian's ``chromium`` when run as root).
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image
from preview_helpers import (
    COLOURS,
    CRUDE_YAML,
    loud_then_silent,
    make_dataset,
    png,
    run,
    solid,
    wav_bytes,
)

from megatron_energon_lite import WorkerConfig, get_savable_loader, get_train_dataset
from megatron_energon_lite.cli.main import cli

CHROMIUM = next((path for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome") if (path := shutil.which(name))), None)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary on PATH (scripts/setup.sh installs Debian's chromium when run as root): the HTML page is not rendered")

WIDTH = 1100

HOOK = """<script>
(function () {
  var problems = [];
  window.addEventListener('error', function (e) {
    var t = e.target;
    if (t && t !== window && t.tagName) { problems.push('failed to load <' + t.tagName.toLowerCase() + ' class=' + t.className + '>'); }
    else { problems.push('script error: ' + e.message); }
  }, true);
  window.addEventListener('unhandledrejection', function (e) { problems.push('unhandled rejection: ' + e.reason); });
  document.addEventListener('securitypolicyviolation', function (e) { problems.push('CSP violation: ' + e.violatedDirective + ' ' + e.blockedURI); });
  var consoleError = console.error;
  console.error = function () { problems.push('console.error: ' + Array.prototype.join.call(arguments, ' ')); consoleError.apply(console, arguments); };
  // Reported a little after load: CSP violation events are queued as tasks after the fact.
  window.addEventListener('load', function () { setTimeout(report, 300); });
  function report() {
    var images = [];
    document.querySelectorAll('img').forEach(function (img) {
      if (!img.complete || img.naturalWidth === 0) { problems.push('image not decoded: <img class=' + img.className + '>'); }
      var r = img.getBoundingClientRect();
      images.push({cls: img.className, x: r.left + window.scrollX, y: r.top + window.scrollY, w: r.width, h: r.height, natural: [img.naturalWidth, img.naturalHeight]});
    });
    var out = document.createElement('pre');
    out.id = 'preview-test-report';
    out.textContent = JSON.stringify({problems: problems, images: images, height: document.documentElement.scrollHeight});
    document.body.appendChild(out);
  }
})();
</script>"""


def _chromium(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    # --no-sandbox: tests may run as root; everything it opens is a local file:// page.
    command = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--force-device-scale-factor=1", "--no-first-run", "--enable-logging=stderr", "--v=0", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)


def inspect(page: Path, screenshot: Path | None = None) -> tuple[dict, Image.Image | None]:
    """Loads ``page`` with the hook; returns the hook's report (plus console errors Chromium
    logged) and, when asked, a screenshot of the whole page."""
    hooked = page.with_name(page.stem + ".hooked.html")
    text = page.read_text()
    hooked.write_text(text.replace("<head>", "<head>" + HOOK, 1) if "<head>" in text else HOOK + text)
    dom = _chromium("--virtual-time-budget=10000", f"--window-size={WIDTH},900", "--dump-dom", hooked.as_uri())
    found = re.search(r'<pre id="preview-test-report">(.*?)</pre>', dom.stdout, re.S)
    assert found, f"the hook wrote no report; chromium said:\n{dom.stderr[-3000:]}"
    report = json.loads(html.unescape(found.group(1)))
    # Chromium's own log of the console (a second witness besides the hook).
    report["problems"] += [line for line in dom.stderr.splitlines() if "CONSOLE" in line and ("Uncaught" in line or "ERROR" in line.upper().split("CONSOLE")[0])]
    image = None
    if screenshot is not None:
        height = int(report["height"]) + 20
        shot = _chromium("--virtual-time-budget=10000", f"--window-size={WIDTH},{height}", f"--screenshot={screenshot}", hooked.as_uri())
        assert screenshot.exists(), shot.stderr[-3000:]
        image = Image.open(screenshot).convert("RGB")
    return report, image


@pytest.fixture
def page(tmp_path: Path) -> Path:
    """The HTML preview of a crude dataset: three solid-colour images, a video and an audio part."""
    pytest.importorskip("av")
    from energon_lite_dev.synthetic import make_video

    samples = [(f"s{i}", {"png": png(solid(COLOURS[i], (48, 36))), "txt": f"colour {i} <b>bold?</b>".encode()}) for i in range(3)]
    samples.append(("v0", {"mp4": make_video(frames=8, fps=8, size=(32, 24)), "txt": b"a video"}))
    samples.append(("a0", {"wav": wav_bytes(loud_then_silent(8000, 0.5), 8000), "txt": b"a sound"}))
    root = make_dataset(tmp_path / "ds", samples, CRUDE_YAML)
    out = tmp_path / "preview.html"
    assert run("preview", str(root), "-n", "5", "--html", str(out)).exit_code == 0
    return out


def test_page_renders_without_errors_and_shows_the_images(page: Path, tmp_path: Path) -> None:
    report, shot = inspect(page, tmp_path / "shot.png")
    assert report["problems"] == []
    thumbs = [i for i in report["images"] if i["cls"] == "thumb"]
    frames = [i for i in report["images"] if i["cls"] == "frame"]
    assert len(thumbs) == 3 and len(frames) == 4
    assert all(i["natural"] == [48, 36] for i in thumbs)
    pixels = np.asarray(shot).astype(int)
    assert pixels.shape[0] >= max(i["y"] + i["h"] for i in report["images"])
    for colour, box in zip(COLOURS, thumbs):
        x, y, w, h = (round(box[k]) for k in ("x", "y", "w", "h"))
        region = pixels[y + 2 : y + h - 2, x + 2 : x + w - 2]
        assert region.size and np.abs(region - colour).max() <= 12, (colour, region.reshape(-1, 3)[:3])
    white = np.array([255, 255, 255])
    for box in frames:  # gray frames: not the page's white
        x, y, w, h = (round(box[k]) for k in ("x", "y", "w", "h"))
        region = pixels[y + 2 : y + h - 2, x + 2 : x + w - 2]
        assert region.size and (np.abs(region - white).max(axis=2) > 60).all()
        assert np.ptp(region, axis=2).max() <= 6  # and gray


def test_detector_catches_a_broken_image_a_thrown_error_and_a_blocked_script(page: Path, tmp_path: Path) -> None:
    text = page.read_text()
    broken = tmp_path / "broken_image.html"
    broken.write_text(text.replace("</body>", '<img class="bad" src="data:image/jpeg;base64,AAAAAAAA" width="10" height="10"></body>'))
    assert any("bad" in p and ("failed to load" in p or "not decoded" in p) for p in inspect(broken)[0]["problems"])

    thrown = tmp_path / "thrown.html"
    thrown.write_text('<!DOCTYPE html><html><head><meta charset="utf-8"></head><body><p>x</p><script>throw new Error("boom")</script></body></html>')
    assert any("boom" in p for p in inspect(thrown)[0]["problems"])

    blocked = tmp_path / "blocked.html"  # our page forbids scripts: an injected one would be refused
    blocked.write_text(text.replace("</body>", "<script>document.title = 'ran'</script></body>"))
    assert any("CSP violation" in p for p in inspect(blocked)[0]["problems"])


def test_a_manifest_step_page_renders_without_errors(prepared_captioning: Path, tmp_path: Path) -> None:
    """``energon-lite manifest show --html``: the same renderer, a step's samples."""
    dataset = get_train_dataset(prepared_captioning, worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0), batch_size=3, shuffle_buffer_size=5, max_samples_per_sequence=3)
    loader = get_savable_loader(dataset, manifest=tmp_path / "m")
    next(iter(loader))
    loader.save_state_rank()
    page = tmp_path / "step.html"
    result = CliRunner().invoke(cli, ["manifest", "show", str(tmp_path / "m"), "--step", "0", "--html", str(page)])
    assert result.exit_code == 0, result.output
    report, _ = inspect(page)
    assert report["problems"] == []
    assert len(report["images"]) == 3 and all(image["natural"][0] > 0 for image in report["images"])
