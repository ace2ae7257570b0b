"""Build `reports/index.html` from what the stages wrote under `reports/` (no network, no JavaScript).

Reads: reports/t2i/manifest.json + metrics.json + tables/ + figures/ (analyze), reports/t2i/reliability/
(reliability), reports/vlm/ (Method B: summary.json, figures, tables), reports/notebooks/*.html
(every executed notebook). Every link is relative, so the page works from the file system.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd
from jinja2 import Environment, select_autoescape

from biasaudit.io import atomic_write_text
from biasaudit.provenance import git_commit, stable_hash, utc_now

FIGURE_EXTS = (".png", ".svg", ".jpg", ".jpeg")

TEMPLATE = """{% macro render_table(t) %}<h4>{{ t.title }}</h4>{% if t.note %}<p>{{ t.note }}</p>{% endif %}
<div class="scroll">{{ t.html|safe }}</div>
<p>{% for name, href in t.links %}<a href="{{ href }}">{{ name }}</a> {% endfor %}</p>{% endmacro %}
{% macro render_figure(f) %}<figure><img src="{{ f.src }}" alt="{{ f.title }}">
<figcaption><b>{{ f.title }}</b> {{ f.caption }} {% for name, href in f.links %}<a href="{{ href }}">{{ name }}</a> {% endfor %}</figcaption></figure>{% endmacro %}
{% macro render_summary(d) %}<div class="scroll">{{ d|safe }}</div>{% endmacro %}
{% macro render_section(s) %}<h3 id="sec-{{ s.name }}">{{ s.title }}
<span class="status s-{{ s.status|replace(' ', '') }}">{{ s.status }}</span></h3>
{% if s.reason %}<p><b>{{ 'No data' if s.status == 'no data' else 'Note' }}:</b> {{ s.reason }}</p>{% endif %}
{% if s.notes %}<ul>{% for n in s.notes %}<li>{{ n }}</li>{% endfor %}</ul>{% endif %}
{% for f in s.figures %}{{ render_figure(f) }}{% endfor %}
{% for t in s.tables %}{{ render_table(t) }}{% endfor %}{% endmacro %}
<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{ title }}</title>
<style>
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;max-width:1200px;margin:0 auto;padding:0 1em 3em;color:#222}
.standin{border:6px solid #b00;background:#fff0f0;color:#b00;padding:.6em 1em;margin:1em 0;font-size:2.2em;font-weight:700;line-height:1.2}
.standin small{display:block;font-size:.5em;font-weight:400}
.profile{border:2px solid #264;padding:.5em 1em;margin:1em 0;font-size:1.2em}
table{border-collapse:collapse;font-size:.85em;margin:.5em 0}td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}
.status{display:inline-block;padding:0 .5em;border-radius:3px;font-size:.8em;vertical-align:middle}
.s-ok{background:#dfd}.s-nodata{background:#eee}
figure{margin:1em 0}figure img{max-width:100%;border:1px solid #ddd}figcaption{font-size:.9em;color:#444}
.scroll{overflow-x:auto}nav a{margin-right:1em}dl{display:grid;grid-template-columns:max-content auto;gap:.2em 1em}
dt{font-weight:600}pre{background:#f7f7f7;padding:.5em;overflow-x:auto;font-size:.85em}
</style></head><body>
<h1>{{ title }}</h1>
{% if stand_in %}<div class="standin" role="alert">STAND-IN RUN — these numbers describe no real model
<small>Profile <b>{{ profile }}</b>: random-weight stand-in models and packaged photos, a handful of prompts.
They test that the pipeline works end to end; switch to the paper profile for real results.</small></div>
{% else %}<div class="profile">Profile: <b>{{ profile }}</b></div>{% endif %}
<nav>{% for id, name in nav %}<a href="#{{ id }}">{{ name }}</a>{% endfor %}</nav>

<h2 id="provenance">Provenance</h2>
<dl><dt>git commit</dt><dd><code>{{ commit }}</code></dd><dt>params hash</dt><dd><code>{{ params_hash }}</code></dd>
<dt>seed</dt><dd>{{ seed }}</dd><dt>built</dt><dd>{{ built }}</dd>
<dt>analysis</dt><dd>{% if analysis_info %}{{ analysis_info }}{% else %}not run yet{% endif %}</dd></dl>
{% for t in provenance_tables %}{{ render_table(t) }}{% endfor %}

<h2 id="headline">Headline results</h2>
{% if headline %}{% for h in headline %}<h3>{{ h.title }}</h3><div class="scroll">{{ h.html|safe }}</div>{% endfor %}
{% else %}<p>No headline results yet: {{ headline_reason }}</p>{% endif %}

<h2 id="t2i">Method A: proxy audit of text-to-image generators</h2>
{% if not t2i_sections %}<p>No analysis outputs yet (reports/t2i/manifest.json not found).</p>{% endif %}
{% for s in t2i_sections %}{{ render_section(s) }}{% endfor %}

<h2 id="vlm">Method B: face-only counterfactual audit of VLMs</h2>
{% if vlm.missing %}<p>No Method B outputs yet: {{ vlm.missing }}</p>{% else %}
{% if vlm.summary %}<h3>Summary</h3>{{ render_summary(vlm.summary) }}{% endif %}
{% for f in vlm.figures %}{{ render_figure(f) }}{% endfor %}
{% for t in vlm.tables %}{{ render_table(t) }}{% endfor %}
{% if vlm.other %}<p>Other files: {% for name, href in vlm.other %}<a href="{{ href }}">{{ name }}</a> {% endfor %}</p>{% endif %}
{% endif %}

<h2 id="notebooks">Executed notebooks</h2>
{% if notebooks %}<ul>{% for name, href in notebooks %}<li><a href="{{ href }}">{{ name }}</a></li>{% endfor %}</ul>
{% else %}<p>No executed notebooks found under reports/notebooks/.</p>{% endif %}
</body></html>
"""


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return "" if math.isnan(v) else f"{v:.3f}"
    return str(v)


def table_html(df: pd.DataFrame, max_rows: int) -> str:
    shown = df.head(max_rows)
    html = shown.to_html(index=False, na_rep="", float_format=lambda v: f"{v:.3f}", border=0)
    if len(df) > max_rows:
        html += f"<p>… {len(df) - max_rows} more rows in the linked file.</p>"
    return html


def _read_csv(path: Path) -> pd.DataFrame | None:
    try:
        return pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, OSError):
        return None


def _table_entry(path: Path, reports: Path, max_rows: int, title: str | None = None) -> dict[str, Any]:
    df = _read_csv(path)
    links = [(path.name, path.relative_to(reports).as_posix())]
    md = path.with_suffix(".md")
    if md.exists():
        links.append((md.name, md.relative_to(reports).as_posix()))
    return {"title": title or path.stem.replace("_", " "), "links": links,
            "html": table_html(df, max_rows) if df is not None else "",
            "note": "" if df is not None else "unreadable or empty CSV"}


def _ci(est: Any, low: Any, high: Any) -> str:
    vals = [float(v) if v is not None and v == v else math.nan for v in (est, low, high)]
    if math.isnan(vals[0]):
        return ""
    if math.isnan(vals[1]) or math.isnan(vals[2]):
        return f"{vals[0]:.3f}"
    return f"{vals[0]:.3f} [{vals[1]:.3f}, {vals[2]:.3f}]"


def headline_tables(t2i: Path, level: str) -> list[dict[str, str]]:
    """TVD per model × category, dark-skin share and earnings slope, each with its interval."""
    out = []
    tvd = _read_csv(t2i / "tables/tvd_summary.csv")
    if tvd is not None and len(tvd):
        wide = pd.DataFrame({
            "model": tvd["model"], "category": tvd["category"],
            f"mean per-prompt TVD [{level} CI]": [_ci(*r) for r in tvd[["mean_tvd", "mean_tvd_low", "mean_tvd_high"]].itertuples(index=False)],
            f"pooled TVD [{level} CI]": [_ci(*r) for r in tvd[["pooled_tvd", "pooled_tvd_low", "pooled_tvd_high"]].itertuples(index=False)],
            "prompts": tvd["n_prompts"], "images": tvd["n_images"], "abstentions": tvd["n_unknown"]})
        out.append({"title": "Distance from the benchmark (TVD; 0 = identical, 1 = no overlap)",
                    "html": table_html(wide, 200)})
    dark = _read_csv(t2i / "tables/skin_dark_share.csv")
    if dark is not None and len(dark):
        wide = pd.DataFrame({"model": dark["model"], "faces measured": dark["n_measured"],
                             "faces with L* below threshold": dark["n_dark"],
                             f"share classified {dark['group'].iloc[0]} [{level} CI]":
                                 [_ci(*r) for r in dark[["share", "share_low", "share_high"]].itertuples(index=False)]})
        out.append({"title": f"Very dark skin (L* < {dark['L_threshold'].iloc[0]:g})", "html": table_html(wide, 50)})
    ols = _read_csv(t2i / "tables/skin_earnings_ols.csv")
    if ols is not None and len(ols):
        unit = ols["slope_unit_usd"].iloc[0]
        wide = pd.DataFrame({"model": ols["model"], f"L* per ${unit:g}/week [{level} CI]":
                             [_ci(*r) for r in ols[["slope", "ci_low", "ci_high"]].itertuples(index=False)],
                             "p-value": ols["p_value"].map(lambda v: "" if v != v else f"{v:.3g}"),
                             "images": ols["n"], "prompts": ols["n_clusters"], "note": ols["reason"].fillna("")})
        out.append({"title": f"Skin lightness vs median weekly earnings ({ols['group'].iloc[0]}-classified occupational images)",
                    "html": table_html(wide, 50)})
    return out


def t2i_sections(t2i: Path, reports: Path, max_rows: int) -> list[dict[str, Any]]:
    path = t2i / "manifest.json"
    if not path.exists():
        return []
    manifest = json.loads(path.read_text())
    sections = []
    for s in manifest.get("sections", []):
        if s.get("name") == "provenance":
            continue  # rendered once, at the top of the page
        figures = [{"title": f["title"], "caption": f.get("caption", ""),
                    "src": (t2i / f["png"]).relative_to(reports).as_posix(),
                    "links": [("SVG", (t2i / f["svg"]).relative_to(reports).as_posix())] if f.get("svg") else []}
                   for f in s.get("figures", []) if (t2i / f["png"]).exists()]
        tables = [_table_entry(t2i / t["csv"], reports, max_rows, t["name"].replace("_", " "))
                  for t in s.get("tables", []) if (t2i / t["csv"]).exists()]
        sections.append({**s, "figures": figures, "tables": tables})
    rel = t2i / "reliability"
    if rel.is_dir():  # the reliability stage's own files, rendered as they are
        tables = [_table_entry(p, reports, max_rows) for p in sorted(rel.glob("*.csv"))]
        figures = [{"title": p.stem.replace("_", " "), "caption": "", "src": p.relative_to(reports).as_posix(),
                    "links": []} for p in sorted(rel.glob("*.png"))]
        for s in sections:
            if s["name"] == "reliability":
                s["tables"] += tables
                s["figures"] += figures
                summary = rel / "summary.json"
                if summary.exists():
                    s["tables"].append({"title": "summary.json", "html": _summary_html(summary), "note": "",
                                        "links": [("summary.json", summary.relative_to(reports).as_posix())]})
    return sections


def _summary_html(path: Path) -> str:
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, OSError) as exc:
        return f"<p>unreadable: {type(exc).__name__}</p>"
    if isinstance(data, dict):
        flat = pd.json_normalize(data, sep=".").T.reset_index()
        flat.columns = ["key", "value"]
        flat["value"] = flat["value"].map(_fmt)
        return table_html(flat, 500)
    return "<pre>" + pd.io.formats.printing.pprint_thing(data, escape_chars=None) + "</pre>"


def vlm_section(reports: Path, max_rows: int) -> dict[str, Any]:
    """Whatever reports/vlm/ holds: summary.json, figures (PNG/SVG), tables (CSV + MD), other files."""
    vlm = reports / "vlm"
    if not vlm.is_dir() or not any(vlm.iterdir()):
        return {"missing": f"{vlm.as_posix()}/ not found or empty (the reflect_analysis stage writes it)"}
    files = sorted(p for p in vlm.rglob("*") if p.is_file() and not p.name.startswith("."))
    summary = vlm / "summary.json"
    out: dict[str, Any] = {"missing": "", "summary": _summary_html(summary) if summary.exists() else "",
                           "figures": [], "tables": [], "other": []}
    used = {summary}
    for p in files:
        rel = p.relative_to(reports).as_posix()
        if p.suffix == ".png" or (p.suffix == ".svg" and not p.with_suffix(".png").exists()):
            svg = p.with_suffix(".svg")
            links = [("SVG", svg.relative_to(reports).as_posix())] if p.suffix == ".png" and svg.exists() else []
            out["figures"].append({"title": p.relative_to(vlm).with_suffix("").as_posix().replace("_", " "),
                                   "caption": "", "src": rel, "links": links})
            used |= {p, svg}
        elif p.suffix == ".csv":
            out["tables"].append(_table_entry(p, reports, max_rows, p.relative_to(vlm).with_suffix("").as_posix()))
            used |= {p, p.with_suffix(".md")}
    out["other"] = [(p.relative_to(vlm).as_posix(), p.relative_to(reports).as_posix()) for p in files if p not in used]
    return out


def build_index(reports_dir: str | Path, params: Any, title: str = "biasaudit report", max_table_rows: int = 60,
                level: float = 0.95) -> Path:
    """Write `<reports_dir>/index.html` and return its path. `params` is the validated Params."""
    reports = Path(reports_dir)
    t2i = reports / "t2i"
    metrics_path = t2i / "metrics.json"
    metrics = json.loads(metrics_path.read_text()) if metrics_path.exists() else {}
    provenance = [_table_entry(t2i / "tables" / f"{name}.csv", reports, max_table_rows, label)
                  for name, label in (("provenance_models", "Models (ids and revisions)"),
                                      ("provenance_stage_counts", "Counts per stage: images, abstentions, "
                                                                  "missing faces, failures"))
                  if (t2i / "tables" / f"{name}.csv").exists()]
    stand_in = params.profile == "offline" or bool(metrics.get("stand_in"))
    notebooks = [(p.stem, p.relative_to(reports).as_posix()) for p in sorted((reports / "notebooks").glob("*.html"))]
    headline = headline_tables(t2i, f"{level:.0%}")
    env = Environment(autoescape=select_autoescape(default=True, default_for_string=True))
    page = env.from_string(TEMPLATE).render(
        title=title, profile=params.profile, stand_in=stand_in, commit=git_commit(),
        params_hash=stable_hash(params.model_dump()), seed=params.seed, built=utc_now(),
        analysis_info=", ".join(f"{k}: {metrics[k]}" for k in ("git_commit", "created_at", "n_boot") if k in metrics),
        provenance_tables=provenance, headline=headline,
        headline_reason="the analyze stage has not written reports/t2i/tables/tvd_summary.csv",
        t2i_sections=t2i_sections(t2i, reports, max_table_rows), vlm=vlm_section(reports, max_table_rows),
        notebooks=notebooks,
        nav=[("provenance", "Provenance"), ("headline", "Headline"), ("t2i", "Method A"), ("vlm", "Method B"),
             ("notebooks", "Notebooks")])
    return atomic_write_text(reports / "index.html", page)
