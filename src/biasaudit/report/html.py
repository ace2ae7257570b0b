"""Build the offline report: `reports/index.html`, a front page for decisions, plus the pages it links.

Front page, short enough to read in five minutes: the stand-in banner, at most six findings (each
led by its validated estimate and its interval), the key figures (open), then one line per section
linking to its own page under `reports/pages/`: the headline blocks (model comparison, Method B,
validation, instrument bias, calibration: a table, its findings, the `src/` function that made it and
the notebook cell that called it, CSV downloads), every analysis section's figures and tables, and
the notebooks (what each stage read, wrote, how long it took). Also written: `images.html`, `focus.html` (gallery.py), the
notebooks' HTML (`reports/html/`, trail.py) and the tracked headline metrics file (headline.py).
No network, no external script; every link is relative.
"""

from __future__ import annotations

import html as _html
import json
import math
from pathlib import Path
from typing import Any

import pandas as pd
from jinja2 import Environment, select_autoescape

from biasaudit import contracts as C
from biasaudit.pipeline.io import atomic_write_text
from biasaudit.pipeline.provenance import git_commit, stable_hash, utc_now
from biasaudit.report.front import Block, build_blocks, headline_findings
from biasaudit.report.load import Outputs, read_csv, read_json
from biasaudit.report.trail import StageInfo, short_path, stages
from biasaudit.vlm.declared import task_units

KEY_FIGURES = ("figure2_shares", "skin_L_by_label", "homogeneity_gap_heatmap")

STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;max-width:1300px;margin:0 auto;padding:0 1em 3em;color:#222;line-height:1.35;overflow-wrap:anywhere}
h1{font-size:1.5em;margin:.6em 0 .2em}h2{font-size:1.25em;border-bottom:2px solid #ddd;margin:1.2em 0 .4em}h3{font-size:1.05em;margin:.8em 0 .3em}h4{font-size:.95em;margin:.6em 0 .2em}
.standin{border:6px solid #b00;background:#fff0f0;color:#b00;padding:.5em 1em;margin:.6em 0;font-size:2.2em;font-weight:700;line-height:1.15}
.standin small{display:block;font-size:.45em;font-weight:400}
.profile{border:2px solid #264;padding:.4em 1em;margin:.6em 0;font-size:1.1em}
table.t{border-collapse:collapse;font-size:.82em;margin:.3em 0}.t td,.t th{border:1px solid #ccc;padding:2px 6px;text-align:right;vertical-align:top;overflow-wrap:normal}
.t th{background:#f3f3f3}.t td:first-child,.t th:first-child{text-align:left}.t small{color:#555}
.status{display:inline-block;padding:0 .5em;border-radius:3px;font-size:.8em}.s-ok{background:#dfd}.s-nodata,.s-notrun{background:#eee}.s-failed{background:#fdd}
figure{margin:.6em 0;min-width:0}figure img{max-width:100%;height:auto;border:1px solid #ddd}figcaption{font-size:.85em;color:#444}
.scroll{overflow-x:auto;max-width:100%}nav{font-size:.9em}nav a{margin-right:.9em}.note{color:#555;font-size:.88em;margin:.2em 0}
.trail{font-size:.8em;color:#555;margin:.1em 0 .6em}.findings li{margin:.25em 0}.lines li{margin:.15em 0;font-size:.92em}
.figs{display:grid;grid-template-columns:repeat(3,minmax(0,1fr));gap:0 1em;align-items:start}@media (max-width:900px){.figs{grid-template-columns:1fr}}
.strip{overflow:hidden;white-space:nowrap}.strip img{height:96px;width:auto;margin-right:4px;border:1px solid #ccc}.prov{font-size:.85em;color:#444}
"""

HEAD = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
{% if base %}<base href="{{ base }}">{% endif %}<title>{{ title }}</title>
<style>{{ style }}</style></head><body>
{% if stand_in %}<div class="standin" role="alert">STAND-IN RUN — these numbers describe no real model
<small>Profile <b>{{ profile }}</b>: planted, simulated or random-weight parts ran ({{ stand_ins }}). The
numbers test the audit's own machinery (planted truth is recovered where it was planted); a run is real only when
no such part ran (the paper and current profiles, with their models).</small></div>
{% else %}<div class="profile">Profile: <b>{{ profile }}</b></div>{% endif %}
{% if skipped %}<div class="profile skipped">Skipped measurements (switched off by this run's parameters): {{ skipped }}</div>{% endif %}
"""

# a headline block (its own page) and an analysis section (its own page)
BLOCK = """<h1>{{ b.title }}</h1><p><a href="index.html">← front page</a></p>
{% if b.findings %}<ul class="findings">{% for f in b.findings %}<li>{{ f }}</li>{% endfor %}</ul>{% endif %}
{% if b.html %}<div class="scroll">{{ b.html|safe }}</div>{% endif %}{% if b.extra %}<div class="scroll">{{ b.extra|safe }}</div>{% endif %}
{% if b.note %}<p class="note">{% if not b.html %}<b>No data:</b> {% endif %}{{ b.note }}</p>{% endif %}
<p class="trail">{% if b.credits %}{% for name, function, notebook, href in b.credits %}{% if not loop.first %}; {% endif %}{{ name }}
made by <code>{{ function }}</code>{% if href %} in <a href="{{ href }}">{{ notebook }}{% if '#' in href %} (the cell){% endif %}</a>{% endif %}{% endfor %}
{% else %}{% if b.function %}made by <code>{{ b.function }}</code>{% endif %}{% if b.trail_href %} in
<a href="{{ b.trail_href }}">{{ b.notebook }}{% if '#' in b.trail_href %} (the cell){% endif %}</a>{% endif %}{% endif %}
{% for name, href in b.downloads %} · <a href="{{ href }}" download>{{ name }}</a>{% endfor %}</p></body></html>
"""

SECTION = """<h1>{{ s.title }} <span class="status s-{{ s.status|replace(' ', '') }}">{{ s.status }}</span></h1>
<p><a href="index.html">← front page</a></p>
{% if s.reason %}<p class="note"><b>{{ 'No data' if s.status != 'ok' else 'Note' }}:</b> {{ s.reason }}</p>{% endif %}
{% if s.notes %}<ul>{% for n in s.notes %}<li>{{ n }}</li>{% endfor %}</ul>{% endif %}
{% for f in s.figures %}{% if f.src %}<figure><img src="{{ f.src }}" alt="{{ f.title }}">
<figcaption><b>{{ f.title }}</b> {{ f.caption }}{% for name, href in f.links %} <a href="{{ href }}">{{ name }}</a>{% endfor %}</figcaption></figure>
{% else %}<p class="note"><b>{{ f.title }}</b> — no data: {{ f.reason }}</p>{% endif %}{% endfor %}
{% for t in s.tables %}<h4>{{ t.title }}</h4><div class="scroll">{{ t.html|safe }}</div><p>{% for name, href in t.links %}<a href="{{ href }}" download>{{ name }}</a> {% endfor %}</p>{% endfor %}
</body></html>
"""

NOTEBOOKS = """<h1>Notebooks: what each stage read, wrote and how long it took</h1><p><a href="index.html">← front page</a></p>
<p class="note">{{ stage_summary }}</p><div class="scroll"><table class="t"><tr><th>stage</th><th>notebook</th><th>read</th><th>wrote</th><th>status</th></tr>
{% for s in stage_rows %}<tr><td>{{ s.stage }}</td><td>{% if s.html %}<a href="{{ s.html }}">HTML</a> {% endif %}{% if s.ipynb %}<a href="{{ s.ipynb }}">ipynb</a>{% endif %}</td>
<td><small>{{ s.reads }}</small></td><td><small>{{ s.writes }}</small></td><td><span class="status s-{{ s.status|replace(' ', '') }}">{{ s.status }}</span> {{ s.reason }}</td></tr>{% endfor %}</table></div>
</body></html>
"""

TEMPLATE = """<h1>{{ title }}</h1>
<p class="prov">git commit <code>{{ commit }}</code> · params hash <code>{{ params_hash }}</code> · seed {{ seed }} · commit date {{ built }}
{% if analysis_info %} · analysis: {{ analysis_info }}{% endif %}</p>
<nav><a href="#findings">Findings</a><a href="#figures">Figures</a><a href="#sections">Sections</a><a href="images.html">Images</a><a href="focus.html">FOCUS edits</a><a href="audit/index.html">Audit cards</a>{% if replication %}<a href="pages/{{ replication_page }}">Replication</a>{% endif %}{% if assumptions %}<a href="pages/{{ assumptions_page }}">Assumptions</a>{% endif %}<a href="pages/notebooks.html">Notebooks</a></nav>

<h2 id="findings">Main findings</h2>
{% if findings %}<ul class="findings">{% for f in findings %}<li>{{ f }}</li>{% endfor %}</ul>
{% else %}<p class="note">No findings yet: no analysis outputs under reports/.</p>{% endif %}

<h2 id="figures">Key figures</h2>
{% if key_figures %}<div class="figs">{% for f in key_figures %}<figure><img src="{{ f.src }}" alt="{{ f.title }}" loading="eager"><figcaption><b>{{ f.title }}</b> {{ f.caption }}
<span class="trail">made by <code>{{ f.function }}</code>{% if f.href %} in <a href="{{ f.href }}">t2i_analyze (the cell)</a>{% endif %}</span></figcaption></figure>{% endfor %}</div>
{% else %}<p class="note">No key figures yet{% if not t2i_ran %}: reports/t2i/manifest.json not found (the analyze stage has not run){% endif %}.</p>{% endif %}

<h2 id="sections">Every section, one line each</h2>
{% for heading, group in groups %}<h3>{{ heading }}</h3>{% if group == 'method_b' and vlm_missing %}<p class="note"><b>No data:</b> {{ vlm_missing }}</p>{% endif %}
<ul class="lines">{% for b in blocks[group] %}<li><a href="{{ b.page }}">{{ b.title }}</a>{% if b.summary %}: {{ b.summary }}{% endif %}</li>{% endfor %}</ul>{% endfor %}
<h3>Every figure and table, by analysis section</h3>
{% if not t2i_ran %}<p class="note"><b>No data:</b> reports/t2i/manifest.json not found (the analyze stage has not run).</p>{% endif %}
<ul class="lines">{% for s in sections %}<li><a href="{{ s.page }}">{{ s.title }}</a> <span class="status s-{{ s.status|replace(' ', '') }}">{{ s.status }}</span>
<small>{{ s.figures|length }} figure{{ '' if s.figures|length == 1 else 's' }}, {{ s.tables|length }} table{{ '' if s.tables|length == 1 else 's' }}{% if s.reason and s.status != 'ok' %}: {{ s.reason }}{% endif %}</small></li>{% endfor %}</ul>
{% for s in hidden %}<p class="note">{{ s.title }} (no figure or table of its own){% if s.notes %}: {{ s.notes|join('; ') }}{% endif %}</p>{% endfor %}

{% if replication %}<h2 id="replication">Replication</h2>
<p><a href="pages/{{ replication_page }}">The papers' published numbers beside this run's</a>: {{ replication }}</p>
{% endif %}
{% if assumptions %}<h2 id="assumptions">Assumptions</h2>
<p><a href="pages/{{ assumptions_page }}">Our assumptions in one place</a>: {{ assumptions }}</p>
{% endif %}
<h2 id="images">Images</h2>
<p><a href="images.html">Browse every generated image</a> ({{ gallery.images.images_shown }} thumbnails with label, L*, face box and skin mask; filters by model, category, label, L* bin)
· <a href="focus.html">FOCUS edits</a> ({{ gallery.focus.photos }} source photos × 10 edits, {{ gallery.focus.flagged }} flagged).</p>
{% if strip %}<p class="strip">{% for t in strip %}<a href="images.html"><img src="{{ t.src }}" alt="{{ t.alt }}"></a>{% endfor %}</p>{% endif %}

<h2 id="notebooks">Notebooks</h2>
<p><a href="pages/notebooks.html">What each stage read, wrote and how long it took</a>: {{ stage_summary }}</p>
</body></html>
"""


def table_html(df: pd.DataFrame, max_rows: int) -> str:
    shown = df.head(max_rows)
    out = shown.to_html(index=False, na_rep="", float_format=lambda v: f"{v:.3f}", border=0, classes="t")
    if len(df) > max_rows:
        out += f"<p class='note'>… {len(df) - max_rows} more rows in the CSV.</p>"
    return out


def _table_entry(path: Path, reports: Path, max_rows: int, title: str | None = None) -> dict[str, Any]:
    df = read_csv(path)
    links = [(path.name, path.relative_to(reports).as_posix())]
    md = path.with_suffix(".md")
    if md.exists():
        links.append((md.name, md.relative_to(reports).as_posix()))
    return {"title": title or path.stem.replace("_", " "), "links": links,
            "html": table_html(df, max_rows) if df is not None else "<p class='note'>No data: unreadable or empty CSV</p>"}


def json_tables(data: Any, max_rows: int = 60, depth: int = 0) -> str:
    """A JSON summary as tables: a flat mapping → key/value rows, a mapping of flat mappings → one
    matrix, deeper mappings → a heading per key; lists of records → a table."""
    if isinstance(data, dict):
        scalars = {k: v for k, v in data.items() if not isinstance(v, (dict, list))}
        nested = {k: v for k, v in data.items() if isinstance(v, (dict, list))}
        parts = []
        if scalars:
            parts.append(table_html(pd.DataFrame({"key": list(scalars), "value": [_cell(v) for v in scalars.values()]}), max_rows))
        flat_children = {k: v for k, v in nested.items()
                         if isinstance(v, dict) and v and all(not isinstance(x, (dict, list)) for x in v.values())}
        if len(flat_children) >= 2:
            matrix = pd.DataFrame({k: {ik: _cell(iv) for ik, iv in v.items()} for k, v in flat_children.items()}).T
            parts.append(table_html(matrix.reset_index(names=""), max_rows))
            nested = {k: v for k, v in nested.items() if k not in flat_children}
        for k, v in nested.items():
            tag = f"h{min(6, 4 + depth)}"
            parts.append(f"<{tag}>{_html.escape(str(k))}</{tag}>" + json_tables(v, max_rows, depth + 1))
        return "".join(parts)
    if isinstance(data, list):
        if data and all(isinstance(x, dict) for x in data):
            return table_html(pd.DataFrame(data).map(_cell), max_rows)
        return "<p>" + _html.escape(", ".join(_cell(x) for x in data)) + "</p>"
    return f"<p>{_html.escape(_cell(data))}</p>"


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return "" if math.isnan(v) else f"{v:.4g}"
    if isinstance(v, (dict, list)):
        return json.dumps(v)[:200]
    return "" if v is None else str(v)


def manifest_sections(out: Outputs, reports: Path, max_rows: int) -> list[dict[str, Any]]:
    """Every section of an analysis manifest, figures with their titles, tables collapsed + CSV."""
    sections = []
    for s in out.sections:
        figures = []
        for f in s.get("figures", []):
            png = out.root / str(f.get("png", ""))
            ok = bool(f.get("png")) and png.exists()
            figures.append({"title": f.get("title", f.get("name", "")), "caption": f.get("caption", ""),
                            "src": png.relative_to(reports).as_posix() if ok else "",
                            "reason": "" if ok else f"{f.get('png', 'figure')} not written",
                            "links": [("SVG", (out.root / f["svg"]).relative_to(reports).as_posix())]
                            if f.get("svg") and (out.root / f["svg"]).exists() else []})
        tables = [_table_entry(out.root / t["csv"], reports, max_rows, t["name"].replace("_", " "))
                  for t in s.get("tables", []) if (out.root / t.get("csv", "")).exists()]
        sections.append({"name": s.get("name", ""), "title": s.get("title", s.get("name", "")),
                         "status": s.get("status", "ok"), "reason": s.get("reason", ""), "notes": s.get("notes", []),
                         "figures": figures, "tables": tables})
    return sections


def _folder_section(folder: Path, reports: Path, max_rows: int, name: str, title: str) -> dict[str, Any] | None:
    """A stage's own folder (reliability, edit checks): its CSVs, PNGs and summary.json as tables."""
    if not folder.is_dir():
        return None
    tables = [_table_entry(p, reports, max_rows) for p in sorted(folder.glob("*.csv"))]
    figures = [{"title": p.stem.replace("_", " "), "caption": "", "src": p.relative_to(reports).as_posix(),
                "reason": "", "links": []} for p in sorted(folder.glob("*.png"))]
    summary = folder / "summary.json"
    data = read_json(summary) if summary.exists() else None
    if data is not None:
        tables.append({"title": "summary.json", "html": json_tables(data, max_rows),
                       "links": [("summary.json", summary.relative_to(reports).as_posix())]})
    return {"name": name, "title": title, "status": "ok", "reason": "", "notes": [], "figures": figures,
            "tables": tables}


def key_figures(sections: list[dict[str, Any]], reports: Path) -> list[dict[str, Any]]:
    """The headline figures, each with the analysis function (named after its section) and its cell."""
    from biasaudit.report.trail import trail

    out = []
    for s in sections:
        for f in s["figures"]:
            if f["src"] and any(Path(f["src"]).stem == k for k in KEY_FIGURES):
                t = trail(reports, "t2i_analyze", f"biasaudit.t2i.analysis.{s['name']}.compute")
                out.append({**f, "function": t.function, "href": t.href})
    return out


def stage_rows(infos: list[StageInfo], reports: Path) -> tuple[list[dict[str, Any]], str]:
    rows, ran = [], 0
    for s in infos:
        html_path = reports / "html" / f"{s.notebook}.html"
        ipynb = reports / "notebooks" / f"{s.notebook}.ipynb"
        ran += ipynb.exists()
        rows.append({"stage": s.stage, "html": f"html/{s.notebook}.html" if html_path.exists() else "",
                     "ipynb": f"notebooks/{s.notebook}.ipynb" if ipynb.exists() else "",
                     "reads": ", ".join(short_path(p) for p in s.reads if not p.startswith(("notebooks/", "src/"))),
                     "writes": ", ".join(short_path(p) for p in s.writes),
                     "status": s.status, "reason": s.reason})
    summary = (f"{len(infos)} stages, {ran} with an executed notebook ('read' omits the notebook and src/ code each "
               "stage also depends on). Wall times of each stage's last run: reports/runs/<notebook>.json, kept out "
               "of this page so that re-running unchanged code changes no output.")
    return rows, summary


PAGES = "pages"  # reports/pages/: a page per headline block, per analysis section, and the notebooks table


STAND_IN_NOTE = "stand-in run: no comparison"  # the replication table's reason on every row of a stand-in run


def replication_summary(table: pd.DataFrame, stand_in: bool) -> str:
    """The front page's line for the replication table (report/replication.py): how many published numbers,
    how many this run computes, how many intervals cover the published value (none under a stand-in run)."""
    def numbers(column: str) -> pd.Series:
        return pd.to_numeric(table[column], errors="coerce") if column in table else pd.Series(dtype=float)

    line = (f"{len(table)} published numbers and claims; this run computes {int(numbers('this_run').notna().sum())}")
    if stand_in:
        return line + f" ({STAND_IN_NOTE})."
    cov = table["covered"].astype(str).str.lower() if "covered" in table else pd.Series(dtype=str)
    return line + (f"; {int((cov == 'true').sum())} of {int(cov.isin(['true', 'false']).sum())} with an interval "
                   "are covered by it.")


ASSUMPTIONS_PAGE = "assumptions.html"  # under reports/pages/: every choice the papers leave open (report/assumptions.py)


def assumptions_line(reports: Path) -> str:
    """The front page's line when report/assumptions.py wrote its page ('' otherwise: no link)."""
    page = Path(reports) / PAGES / ASSUMPTIONS_PAGE
    if not page.exists():
        return ""
    n = page.read_text(encoding="utf-8").count('<tr id="')
    return f"{n} choices the papers leave open, each with its params key, this run's value, our reason and what the paper says."


def replication_line(reports: Path) -> str:
    """The line, when the report stage wrote reports/replication.csv and its page ('' otherwise: no link); a
    stand-in run's table says so in every note, and the line says what the table says."""
    page = reports / PAGES / C.REPLICATION_PAGE
    table = read_csv(reports / C.REPLICATION_CSV.relative_to(C.REPORTS))
    if table is None or not page.exists():
        return ""
    notes = table["note"].fillna("").astype(str) if "note" in table else pd.Series(dtype=str)
    return replication_summary(table, bool(len(notes)) and bool(notes.str.startswith(STAND_IN_NOTE).all()))


def _shown(section: dict[str, Any]) -> bool:
    """An empty section (ok, yet no figure and no table) is not shown; its notes go to the front page."""
    return bool(section["figures"] or section["tables"] or section["status"] != "ok")


def build_index(reports_dir: str | Path, params: Any, title: str = "biasaudit report", max_table_rows: int = 60,
                level: float = 0.95, root: str | Path = ".", gallery: Any = None) -> Path:
    """Write `<reports_dir>/index.html` (banner, findings, key figures, one line per section) and its
    pages under `<reports_dir>/pages/`, and return the front page's path. `params` is the validated
    Params; `gallery` the result of gallery.build_gallery (None: counts shown as 0)."""
    reports, root = Path(reports_dir), Path(root)
    t2i, vlm = Outputs.load(reports / "t2i"), Outputs.load(reports / "vlm")
    stand_in = bool(params.stand_ins()) or bool(t2i.metrics.get("stand_in"))
    lvl = f"{level:.0%}"
    blocks = build_blocks(reports, lvl, params.groups, task_units(params.reflect))
    findings = headline_findings(blocks)
    t2i_secs = manifest_sections(t2i, reports, max_table_rows)
    rel = _folder_section(reports / "t2i/reliability", reports, max_table_rows, "reliability_files",
                          "Classifier reliability: the reliability stage's files")
    if rel:
        t2i_secs.append(rel)
    vlm_secs = manifest_sections(vlm, reports, max_table_rows)
    checks = _folder_section(reports / "vlm/edit_checks", reports, max_table_rows, "edit_checks",
                             "FOCUS edit checks (validate_edits)")
    if checks:
        vlm_secs.append(checks)
    summary = reports / "vlm/summary.json"
    if summary.exists():
        vlm_secs.append({"name": "vlm_summary", "title": "Method B summary.json (as tables)", "status": "ok",
                         "reason": "", "notes": [], "figures": [],
                         "tables": [{"title": "summary.json", "html": json_tables(read_json(summary), max_table_rows),
                                     "links": [("summary.json", "vlm/summary.json")]}]})
    for prefix, secs in (("a", t2i_secs), ("b", vlm_secs)):
        for sec in secs:
            sec["page"] = f"{PAGES}/{prefix}-{sec['name']}.html"
    vlm_missing = "" if (reports / "vlm/manifest.json").exists() else \
        "reports/vlm/manifest.json not found (the reflect_analysis stage has not run)"
    rows, stage_summary = stage_rows(stages(root, reports), reports)
    from biasaudit.report.gallery import strip

    gal = gallery or type("G", (), {"images": {"images_shown": 0}, "focus": {"photos": 0, "flagged": 0}})()
    m = t2i.metrics
    env = Environment(autoescape=select_autoescape(default=True, default_for_string=True))
    common = {"profile": params.profile, "stand_in": stand_in, "style": STYLE,
              "stand_ins": "; ".join(params.stand_ins()) or "the analysis outputs say so",
              "skipped": "; ".join(params.skipped())}

    def page(body: str, name: str, heading: str, **ctx: Any) -> Path:
        text = env.from_string(HEAD + body).render(title=f"{heading} · {title}", base="../", **common, **ctx)
        return atomic_write_text(reports / PAGES / name, text)

    written = set()
    for group in blocks.values():
        for b in group:
            written.add(page(BLOCK, Path(b.page).name, b.title, b=b).name)
    for sec in t2i_secs + vlm_secs:
        if _shown(sec):
            written.add(page(SECTION, Path(sec["page"]).name, sec["title"], s=sec).name)
    written.add(page(NOTEBOOKS, "notebooks.html", "Notebooks", stage_rows=rows, stage_summary=stage_summary).name)
    replication = replication_line(reports)
    if replication:  # written before by report/replication.py: kept, and linked
        written.add(C.REPLICATION_PAGE)
    assumptions = assumptions_line(reports)
    if assumptions:  # written before by report/assumptions.py: kept, and linked
        written.add(ASSUMPTIONS_PAGE)
    for old in (reports / PAGES).glob("*.html"):  # a section that is gone leaves no page behind
        if old.name not in written:
            old.unlink()
    front = env.from_string(HEAD + TEMPLATE).render(
        title=title, base="", **common, commit=git_commit(),
        params_hash=stable_hash(params.model_dump()), seed=params.seed, built=utc_now(),
        analysis_info=", ".join(f"{k} {m[k]}" for k in ("git_commit", "created_at", "n_boot") if k in m),
        findings=findings, blocks=blocks, t2i_ran=(reports / "t2i/manifest.json").exists(), vlm_missing=vlm_missing,
        gallery=gal, strip=strip(reports, reports / "thumbs"), key_figures=key_figures(t2i_secs, reports),
        groups=[("Method A: model comparison (text-to-image generators)", "method_a"),
                ("Method B: VLM decisions on face-only edits", "method_b"), ("Checks on the audit itself", "checks")],
        sections=[sec for sec in t2i_secs + vlm_secs if _shown(sec)], stage_summary=stage_summary,
        hidden=[sec for sec in t2i_secs + vlm_secs if not _shown(sec)], replication=replication,
        replication_page=C.REPLICATION_PAGE, assumptions=assumptions, assumptions_page=ASSUMPTIONS_PAGE)
    return atomic_write_text(reports / "index.html", front)


__all__ = ["Block", "build_index", "json_tables", "replication_summary", "table_html"]
