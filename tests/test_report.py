"""reports/index.html built from a SYNTHETIC fixture tree: content checks, and a headless Chromium
(Debian `chromium`) check that the page has no console errors, every image loads and every link resolves."""

import json
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path
from urllib.parse import unquote, urlparse

import matplotlib
import pandas as pd
import pytest

from biasaudit.params import Params
from biasaudit.report import build_index
from biasaudit.t2i import analysis as an
from biasaudit.t2i.outputs import OutputWriter

from .fixtures_t2i import write_tree

matplotlib.use("Agg")


def _analysis(root: Path) -> None:
    boot = an.Boot(n_boot=50, seed=1)
    inputs = an.load_inputs(root)
    writer = OutputWriter(root / "reports/t2i", dpi=50)
    writer.add(an.representation(inputs, boot))
    writer.add(an.skin_tone(inputs, boot))
    writer.add(an.homogeneity(inputs, boot, n_permutations=20, min_group_size=5))
    writer.add(an.reliability(inputs))
    writer.add(an.corrected_tvd(inputs, boot))
    writer.add(an.Result("provenance", "Provenance", tables={"provenance_stage_counts": an.stage_counts(inputs),
                                                             "provenance_models": an.model_provenance(inputs.manifests)}))
    writer.finish(an.PLOTS, profile="offline", stand_in=True)


def _vlm_and_notebooks(reports: Path) -> None:
    import matplotlib.pyplot as plt

    vlm = reports / "vlm"
    (vlm / "figures").mkdir(parents=True)
    (vlm / "summary.json").write_text(json.dumps({"synthetic": True, "vlms": {"tiny": {"n_responses": 12}}}))
    fig, ax = plt.subplots(figsize=(2, 2))
    ax.plot([0, 1], [0, 1])
    fig.savefig(vlm / "figures/win_rate.png")
    fig.savefig(vlm / "figures/win_rate.svg")
    plt.close(fig)
    pd.DataFrame({"group": ["A", "B"], "win_rate": [0.5, 0.5]}).to_csv(vlm / "win_rates.csv", index=False)
    (reports / "notebooks").mkdir(parents=True, exist_ok=True)
    (reports / "notebooks/t2i_analyze.html").write_text("<!DOCTYPE html><html><body>executed</body></html>")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    root = write_tree(tmp_path_factory.mktemp("report"))
    _analysis(root)
    _vlm_and_notebooks(root / "reports")
    return build_index(root / "reports", Params(profile="offline"), title="synthetic report", max_table_rows=10)


@pytest.mark.slow
def test_page_has_every_section_and_the_stand_in_banner(built):
    html = built.read_text()
    assert "STAND-IN RUN" in html and "describe no real model" in html
    for text in ("Provenance", "git commit", "params hash", "synth-a", "synthetic/synth-a", "Headline results",
                 "mean per-prompt TVD", "Model share vs benchmark share", "Homogeneity gap", "Classifier reliability",
                 "TVD corrected for classifier error", "Method B", "win_rates", "t2i_analyze", "status_failed"):
        assert text in html, text
    assert "http://" not in html and "https://" not in html  # works offline: nothing fetched


def test_missing_outputs_render_as_no_data(tmp_path):
    page = build_index(tmp_path, Params(profile="paper")).read_text()
    assert "STAND-IN" not in page and "No Method B outputs yet" in page and "No analysis outputs yet" in page


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.slow
@pytest.mark.skipif(_chromium() is None, reason="Debian chromium not installed (apt-get install chromium; .ci/run does)")
def test_page_in_headless_chromium(built, tmp_path):
    from websockets.sync.client import connect

    profile = tmp_path / "chrome"
    proc = subprocess.Popen([_chromium(), "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                             "--remote-debugging-port=0", f"--user-data-dir={profile}", "about:blank"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        port_file = profile / "DevToolsActivePort"
        for _ in range(200):
            if port_file.exists() and port_file.read_text().strip():
                break
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list"))
        ws_url = next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")
        errors, msg_id = [], 0
        with connect(ws_url, max_size=None) as ws:
            def call(method, **params):
                nonlocal msg_id
                msg_id += 1
                ws.send(json.dumps({"id": msg_id, "method": method, "params": params}))
                while True:
                    msg = json.loads(ws.recv(timeout=30))
                    if msg.get("id") == msg_id:
                        return msg.get("result", {})
                    collect(msg)

            def collect(msg):
                m, p = msg.get("method"), msg.get("params", {})
                if m == "Runtime.consoleAPICalled" and p["type"] in ("error", "assert"):
                    errors.append(f"console.{p['type']}: {p['args']}")
                elif m == "Runtime.exceptionThrown":
                    errors.append(f"exception: {p['exceptionDetails'].get('text')}")
                elif m == "Log.entryAdded" and p["entry"]["level"] == "error":
                    errors.append(f"log: {p['entry']['text']} {p['entry'].get('url', '')}")
                elif m == "Network.loadingFailed":
                    errors.append(f"load failed: {p.get('errorText')}")
                return m

            for domain in ("Page", "Runtime", "Log", "Network"):
                call(f"{domain}.enable")
            call("Page.navigate", url=built.as_uri())
            deadline = time.time() + 30
            while time.time() < deadline and collect(json.loads(ws.recv(timeout=30))) != "Page.loadEventFired":
                pass
            result = call("Runtime.evaluate", returnByValue=True, expression="""({
                images: [...document.images].map(i => [i.getAttribute('src'), i.complete && i.naturalWidth > 0]),
                links: [...document.links].map(a => a.href),
                ids: [...document.querySelectorAll('[id]')].map(e => e.id),
                banner: getComputedStyle(document.querySelector('.standin')).fontSize})""")["result"]["value"]
        assert not errors, errors
        assert len(result["images"]) >= 6 and all(ok for _, ok in result["images"]), result["images"]
        assert float(result["banner"].rstrip("px")) >= 28  # LARGE type
        assert len(result["links"]) >= 10
        for href in result["links"]:
            url = urlparse(href)
            assert url.scheme == "file", href
            if url.fragment and Path(unquote(url.path)) == built:
                assert url.fragment in result["ids"], href
            else:
                target = Path(unquote(url.path))
                assert target.is_file() and target.stat().st_size > 0, href
    finally:
        proc.terminate()
        proc.wait(timeout=10)
