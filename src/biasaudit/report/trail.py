"""The trail from a number to its code: notebook HTML with cell anchors, the cell that called a
function, and per stage what it read, what it wrote and how long it took.

HTML is exported here, once for every executed notebook, with the `offline` nbconvert template
(the lab template minus require.js, MathJax, Mermaid and widget scripts from a CDN).
"""

from __future__ import annotations

import json
import logging
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TEMPLATES = Path(__file__).parent / "nbtemplates"

# jsonschema (nbformat's validator) imports these optional string-format checkers, and none is ever called:
# no nbformat schema uses the `format` keyword (only a metadata property named "format"). rfc3987_syntax
# ("iri") builds an Earley parser on import, 1.2 s; the others take 0.03 s together. Marked absent before
# nbformat is imported (the stage runner, report.execute, and the report stage's export here), jsonschema
# skips them; nbformat validates every notebook as before.
FORMAT_CHECKERS = ("rfc3987_syntax", "rfc3986_validator", "rfc3339_validator", "isoduration", "webcolors",
                   "uri_template", "jsonpointer", "fqdn")


def skip_imports(names: tuple[str, ...]) -> None:
    """Mark `names` absent in this process (an import of one raises ImportError); one already imported stays."""
    for name in names:
        sys.modules.setdefault(name, None)


def export_html(ipynb: Path, out: Path) -> Path:
    """Write `out` (HTML, no network) from an executed notebook."""
    skip_imports(FORMAT_CHECKERS)
    import nbformat
    from nbconvert import HTMLExporter

    logging.getLogger("traitlets").setLevel(logging.ERROR)  # the alt-text warning for every PNG
    exporter = HTMLExporter(template_name="offline", extra_template_basedirs=[str(TEMPLATES)])
    body, _ = exporter.from_notebook_node(nbformat.read(ipynb, as_version=4),
                                          resources={"metadata": {"name": ipynb.stem}})
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(body)
    return out


def export_all(notebooks: Path, out_dir: Path, skip: tuple[str, ...] = ("report",)) -> dict[str, str]:
    """Export every `*.ipynb` under `notebooks` into `out_dir`; {name: reason} for those that failed."""
    failed = {}
    for nb in sorted(notebooks.glob("*.ipynb")):
        if nb.stem in skip:
            continue
        try:
            export_html(nb, out_dir / f"{nb.stem}.html")
        except Exception as exc:  # a broken notebook file must not take the report down
            failed[nb.stem] = f"{type(exc).__name__}: {exc}"
    return failed


def _source(cell: dict[str, Any]) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else str(src)


def cell_anchor(ipynb: Path, *needles: str) -> str:
    """`cell-id=<id>` of the first code cell whose source contains one of `needles` (in order of
    preference), or '' (link to the notebook's top)."""
    try:
        cells = json.loads(ipynb.read_text()).get("cells", [])
    except (OSError, json.JSONDecodeError):
        return ""
    for needle in needles:
        for cell in cells:
            if cell.get("cell_type") == "code" and needle in _source(cell) and cell.get("id"):
                return f"cell-id={cell['id']}"
    return ""


@dataclass
class Trail:
    """Where a headline table or figure comes from: the src/ function and the notebook cell."""

    function: str  # dotted path, e.g. biasaudit.t2i.analysis.representation.compute
    notebook: str  # e.g. t2i_analyze
    href: str = ""  # relative link from reports/index.html, with the cell anchor
    cell: str = ""


def call_needles(function: str) -> tuple[str, str]:
    """How a notebook cell spells the call of `function` (dotted): `representation.compute(` for a section, else
    the function's name; or, for a section computed in a child process, `result(corrected.compute)` in the cell
    that shows it (pipeline.outputs.Elsewhere)."""
    parts = function.split(".")
    short = ".".join(parts[-2:]) if parts[-1] == "compute" else parts[-1]
    return f"{short}(", f"result({short})"


def trail(reports: Path, notebook: str, function: str, html_dir: str = "html") -> Trail:
    ipynb = reports / "notebooks" / f"{notebook}.ipynb"
    anchor = cell_anchor(ipynb, *call_needles(function)) if ipynb.exists() else ""
    html = reports / html_dir / f"{notebook}.html"
    if html.exists():
        href = f"{html_dir}/{notebook}.html" + (f"#{anchor}" if anchor else "")
    elif ipynb.exists():
        href = f"notebooks/{notebook}.ipynb"
    else:
        href = ""
    return Trail(function, notebook, href, anchor)


@dataclass
class StageInfo:
    stage: str
    notebook: str
    reads: list[str] = field(default_factory=list)
    writes: list[str] = field(default_factory=list)
    seconds: float | None = None
    status: str = "not run"
    reason: str = ""


def _notebook_name(cmd: str, key: str) -> str:
    # scripts/run-notebook notebooks/x.py NAME ...
    parts = cmd.split()
    try:
        i = next(i for i, p in enumerate(parts) if p.endswith("run-notebook"))
        return parts[i + 2].replace("${key}", key)
    except (StopIteration, IndexError):
        return ""


def _foreach_keys(spec: dict[str, Any], params: dict[str, Any]) -> list[str]:
    ref = spec.get("foreach")
    if isinstance(ref, str) and ref.startswith("${") and ref.endswith("}"):
        value: Any = params
        for part in ref[2:-1].split("."):
            value = value.get(part, {}) if isinstance(value, dict) else {}
        return [str(k) for k in value] if isinstance(value, (dict, list)) else []
    if isinstance(ref, (list, dict)):
        return [str(k) for k in ref]
    return []


def _interpolate(text: str, params: dict[str, Any]) -> str:
    """`${a.b}` replaced by params.yaml's value, as DVC does (an unknown name is left as written)."""
    def value(m: re.Match) -> str:
        v: Any = params
        for part in m.group(1).split("."):
            if not isinstance(v, dict) or part not in v:
                return m.group(0)
            v = v[part]
        return str(v) if not isinstance(v, (dict, list)) else m.group(0)

    return re.sub(r"\$\{([A-Za-z0-9_.-]+)\}", value, text)


def stages(root: Path, reports: Path, running: str = "report") -> list[StageInfo]:
    """Every dvc.yaml stage (foreach stages expanded from params.yaml, `${…}` interpolated) with its
    deps, outs (without the executed notebook itself) and the timing the runner stored in the
    notebook's metadata. A stage without a notebook (check) is "ok" when its outputs exist; the
    stage `running` is the one writing this report."""
    import yaml

    try:
        dvc = yaml.safe_load((root / "dvc.yaml").read_text()) or {}
        params = yaml.safe_load((root / "params.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError):
        return []
    out = []
    for name, spec in (dvc.get("stages") or {}).items():
        keys = _foreach_keys(spec, params) if "foreach" in spec else [""]
        body = spec.get("do", spec)
        for key in keys:
            def fill(s, k=key):
                return _interpolate(str(s).replace("${key}", k), params)

            stage = f"{name}@{key}" if key else name
            outs = [fill(next(iter(o)) if isinstance(o, dict) else o) for o in body.get("outs", []) or []]
            outs += [fill(next(iter(o)) if isinstance(o, dict) else o) for o in body.get("metrics", []) or []]
            nb = _notebook_name(str(body.get("cmd", "")), key)
            info = StageInfo(stage, nb, [fill(d) for d in body.get("deps", []) or []],
                             [o for o in outs if not o.startswith("reports/notebooks/")])
            _timing(info, reports / "notebooks" / f"{nb}.ipynb")
            if stage == running:
                info.status, info.reason, info.seconds = "running", "(writing this report)", None
            elif not nb and info.writes and all((root / w).exists() for w in info.writes):
                info.status, info.reason = "ok", f"no notebook: {str(body.get('cmd', '')).split()[0]}"
            out.append(info)
    return out


def _timing(info: StageInfo, ipynb: Path) -> None:
    if not ipynb.exists():
        return
    try:
        meta = json.loads(ipynb.read_text()).get("metadata", {})
    except (OSError, json.JSONDecodeError):
        info.status, info.reason = "unreadable", "the executed notebook is not valid JSON"
        return
    ours, pm = meta.get("biasaudit", {}), meta.get("papermill", {})
    info.seconds = ours.get("wall_s", pm.get("duration"))
    info.status = ours.get("status") or ("failed" if pm.get("exception") else "ok")
    info.reason = ours.get("reason", "")


def short_path(p: str) -> str:
    return re.sub(r"^(data|reports)/", "", p)
