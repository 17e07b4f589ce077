"""The built documentation site in a real headless Chromium: every page loads with no script or
console error and no failed request, every internal link, image and anchor resolves, the search
finds a page, and the API reference renders each documented object with its members.

One browser process (driven over the DevTools protocol, chromium_cdp.py) loads every page from a
local HTTP server, as a reader of a hosted copy of the site would. Skipped only where no Chromium
binary is found (scripts/setup.sh installs Debian's ``chromium`` when run as root).
"""

from __future__ import annotations

import functools
import http.server
import json
import re
import subprocess
import sys
import threading
from pathlib import Path
from urllib.parse import urldefrag, urlsplit

import pytest
from chromium_cdp import CHROMIUM, Browser, problems_in

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary on PATH (scripts/setup.sh installs Debian's chromium when run as root): the docs site is not rendered")

ROOT = Path(__file__).resolve().parents[2]

# What each loaded page reports: anchors (ids), links, images, and whether its content fits the
# window's width (no sideways scrolling).
PAGE_FACTS = """(() => ({
  ids: Array.from(document.querySelectorAll('[id], a[name]')).map(e => e.id || e.getAttribute('name')),
  links: Array.from(document.querySelectorAll('a[href]')).map(a => a.href),
  images: Array.from(document.images).map(i => ({src: i.src, decoded: i.complete && i.naturalWidth > 0})),
  stylesheets: Array.from(document.styleSheets).length,
  overflow: document.documentElement.scrollWidth - window.innerWidth,
}))()"""

SEARCH = """(async () => {
  const input = document.getElementById('mkdocs-search-query');
  input.value = %s;
  for (let tries = 0; tries < 100; tries++) {
    input.dispatchEvent(new KeyboardEvent('keyup'));
    await new Promise(resolve => setTimeout(resolve, 50));
    const found = Array.from(document.querySelectorAll('#mkdocs-search-results a')).map(a => a.href);
    if (found.length) return found;
  }
  return [];
})()"""


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(out)], cwd=ROOT, check=True, capture_output=True)
    return out


@pytest.fixture(scope="module")
def served(site):
    """The site over HTTP on 127.0.0.1 (the search runs in a Web Worker, which file:// forbids)."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    browser = Browser(tmp_path_factory.mktemp("chromium_profile"))
    yield browser
    browser.close()


@pytest.fixture(scope="module")
def pages(site, served, browser) -> dict[str, dict]:
    """Every page of the site, loaded: its URL's path -> its facts and the problems it reported."""
    loaded = {}
    for html in sorted(site.rglob("*.html")):
        path = "/" + str(html.relative_to(site)).removesuffix("index.html")
        events = browser.load(served + path.lstrip("/"))
        loaded[path] = {**browser.evaluate(PAGE_FACTS), "problems": problems_in(events)}
    return loaded


def test_every_page_loads_without_errors(pages):
    assert len(pages) >= 20
    assert {path: facts["problems"] for path, facts in pages.items() if facts["problems"]} == {}
    assert all(facts["stylesheets"] >= 3 for facts in pages.values())


def test_every_internal_link_image_and_anchor_resolves(site, served, pages):
    broken = []
    for path, facts in pages.items():
        broken += [f"{path}: image {image['src']} not shown" for image in facts["images"] if not image["decoded"]]
        for link in facts["links"]:
            if not link.startswith(served):
                continue
            target, anchor = urldefrag(link)
            target_path = urlsplit(target).path
            if target_path in pages:
                if anchor and anchor not in pages[target_path]["ids"]:
                    broken.append(f"{path}: {link}: no anchor #{anchor}")
            elif not (site / target_path.lstrip("/")).is_file():
                broken.append(f"{path}: {link}: no such page or file")
    assert broken == []


def test_pages_fit_the_window(pages):
    """Wide tables and code scroll inside their own box, never the page."""
    assert {path: facts["overflow"] for path, facts in pages.items() if facts["overflow"] > 0} == {}


def test_search_finds_a_page(site, served, browser):
    index = json.loads((site / "search" / "search_index.json").read_text())
    assert {"guide/checkpoints/", "reference/api/", "install/"} <= {entry["location"].partition("#")[0] for entry in index["docs"]}
    browser.load(served)
    found = browser.evaluate(SEARCH % json.dumps("restore_state_global"))
    assert any("/guide/checkpoints/" in link for link in found), found


def test_api_reference_renders_every_object_and_its_members(served, browser):
    """Each ``::: name`` of reference/api.md is a heading with a signature or docstring below
    it, and each listed member is rendered too."""
    source = (ROOT / "docs" / "reference" / "api.md").read_text()
    objects = re.findall(r"^::: (\S+)", source, flags=re.M)
    members = [f"{owner}.{member.strip()}" for owner, listed in re.findall(r"^::: (\S+)\n(?:    .*\n)*?      members: \[([^\]]+)\]", source, flags=re.M) for member in listed.split(",")]
    assert len(objects) >= 10 and len(members) >= 8
    browser.load(served + "reference/api/")
    rendered = browser.evaluate("""(() => Object.fromEntries(Array.from(document.querySelectorAll('.doc-heading[id]')).map(h => {
      const body = h.closest('.doc-object') && h.closest('.doc-object').querySelector('.doc-contents');
      return [h.id, body ? body.innerText.trim().length : 0];
    })))()""")
    assert [name for name in objects + members if name not in rendered] == []
    assert [name for name in objects if rendered[name] < 40] == [], "documented objects with (nearly) no text under their heading"
    text = browser.evaluate("document.body.innerText")
    assert re.findall(r":(?:class|meth|func|attr|data|mod|exc):`?\w+", text) == [], "Sphinx roles shown as text"
