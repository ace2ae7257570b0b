"""Headless Chromium (Debian `chromium`) over the DevTools protocol, for the report tests: per page the
console errors, requests outside file://, image load state, links, page height and width (scrollWidth
against the window's), figures shown without a click, and a screenshot;
for SVG figures the text boxes that overlap."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

LOCAL_SCHEMES = ("file:", "data:", "about:", "blob:", "chrome:", "devtools:")

PAGE_JS = """(async () => {
  await Promise.all([...document.images].map(i => i.complete ? 1 : new Promise(r => { i.onload = i.onerror = r; })));
  const banner = document.querySelector('.standin');
  const out = {
    images: [...document.images].map(i => [i.getAttribute('src'), i.complete && i.naturalWidth > 0]),
    links: [...document.links].map(a => a.href),
    height: Math.max(document.documentElement.scrollHeight, document.body ? document.body.scrollHeight : 0),
    banner: banner ? getComputedStyle(banner).fontSize : null,
    details: document.querySelectorAll('details').length,
    scroll_width: document.documentElement.scrollWidth, client_width: document.documentElement.clientWidth,
    visible_figures: [...document.querySelectorAll('figure img')].filter(i => i.complete && i.naturalWidth > 0
      && i.offsetParent !== null && i.getBoundingClientRect().width > 50).length,
    figures: document.querySelectorAll('figure[data-label]').length, filtered: null};
  const sel = document.querySelector('select[data-filter="label"]');
  if (sel && sel.options.length > 2) {
    sel.value = sel.options[1].value; sel.dispatchEvent(new Event('change'));
    out.filtered = [...document.querySelectorAll('figure[data-label]')].filter(f => !f.hidden && f.offsetParent !== null).length;
    sel.value = ''; sel.dispatchEvent(new Event('change'));
  }
  // per filter and value: headings still shown over no shown figure, and headings hidden with their figures
  const shown = e => e.getClientRects().length > 0;
  out.empty_headings = 0; out.hidden_headings = 0;
  for (const s of document.querySelectorAll('select[data-filter]')) {
    for (const o of [...s.options].slice(1)) {
      s.value = o.value; s.dispatchEvent(new Event('change'));
      for (const sec of document.querySelectorAll('section.group')) {
        const h = sec.querySelector('h3'), figs = [...sec.querySelectorAll('figure')].filter(shown).length;
        if (h && shown(h) && !figs) out.empty_headings++;
        if (h && !shown(h)) out.hidden_headings++;
      }
    }
    s.value = ''; s.dispatchEvent(new Event('change'));
  }
  return out;
})()"""

SVG_JS = """(() => {
  const boxes = [...document.querySelectorAll('g[id^="text_"]')].map(g => {
    const r = g.getBoundingClientRect(); return {id: g.id, x0: r.left, y0: r.top, x1: r.right, y1: r.bottom}; })
    .filter(b => b.x1 - b.x0 > 0 && b.y1 - b.y0 > 0);
  const overlaps = [];
  const tol = 0.5;
  for (let i = 0; i < boxes.length; i++) for (let j = i + 1; j < boxes.length; j++) {
    const a = boxes[i], b = boxes[j];
    const w = Math.min(a.x1, b.x1) - Math.max(a.x0, b.x0) - tol, h = Math.min(a.y1, b.y1) - Math.max(a.y0, b.y0) - tol;
    if (w > 0 && h > 0) overlaps.push([a.id, b.id]);
  }
  return {texts: boxes.length, overlaps: overlaps, images: [], links: [], height: 0};
})()"""


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def visit(paths: list[Path], width: int = 1400, screenshots: Path | None = None, svgs: list[Path] = ()) -> list[dict[str, Any]]:
    """Load each HTML page (then each SVG) in one headless Chromium; one result dict per file."""
    from websockets.sync.client import connect

    profile = Path(tempfile.mkdtemp(prefix="chrome-"))
    proc = subprocess.Popen([chromium(), "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                             "--hide-scrollbars", "--remote-debugging-port=0", f"--user-data-dir={profile}",
                             "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        port_file = profile / "DevToolsActivePort"
        for _ in range(300):
            if port_file.exists() and port_file.read_text().strip():
                break
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list"))
        ws_url = next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")
        results = []
        with connect(ws_url, max_size=None) as ws:
            state = {"id": 0, "errors": [], "external": []}

            def collect(msg: dict) -> str | None:
                m, p = msg.get("method"), msg.get("params", {})
                if m == "Runtime.consoleAPICalled" and p["type"] in ("error", "assert"):
                    state["errors"].append(f"console.{p['type']}: {p['args']}")
                elif m == "Runtime.exceptionThrown":
                    state["errors"].append(f"exception: {p['exceptionDetails'].get('text')}")
                elif m == "Log.entryAdded" and p["entry"]["level"] == "error":
                    state["errors"].append(f"log: {p['entry']['text']} {p['entry'].get('url', '')}")
                elif m == "Network.loadingFailed":
                    state["errors"].append(f"load failed: {p.get('errorText')}")
                elif m == "Network.requestWillBeSent":
                    url = p["request"]["url"]
                    if not url.startswith(LOCAL_SCHEMES):
                        state["external"].append(url)
                return m

            def call(method: str, **params: Any) -> dict:
                state["id"] += 1
                ws.send(json.dumps({"id": state["id"], "method": method, "params": params}))
                while True:
                    msg = json.loads(ws.recv(timeout=60))
                    if msg.get("id") == state["id"]:
                        return msg.get("result", {})
                    collect(msg)

            for domain in ("Page", "Runtime", "Log", "Network"):
                call(f"{domain}.enable")
            call("Emulation.setDeviceMetricsOverride", width=width, height=900, deviceScaleFactor=1, mobile=False)
            for path in [*paths, *svgs]:
                state["errors"], state["external"] = [], []
                call("Page.navigate", url=path.resolve().as_uri())
                deadline = time.time() + 60
                while time.time() < deadline and collect(json.loads(ws.recv(timeout=60))) != "Page.loadEventFired":
                    pass
                js = SVG_JS if path.suffix == ".svg" else PAGE_JS
                value = call("Runtime.evaluate", expression=js, returnByValue=True, awaitPromise=True)["result"]["value"]
                value.update(url=path.as_uri(), errors=list(state["errors"]), external=list(state["external"]))
                if screenshots is not None and path.suffix != ".svg":
                    shot = call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
                    name = f"{path.stem}.png"
                    (screenshots / name).write_bytes(base64.b64decode(shot["data"]))
                    value["screenshot"] = name
                results.append(value)
        return results
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        shutil.rmtree(profile, ignore_errors=True)
