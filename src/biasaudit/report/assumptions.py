"""Our assumptions in one place: every choice the two papers leave open that this project makes
(data/reference/assumptions.csv), each with its value, the params.yaml key that sets it (if any), the reason and
what the paper says, beside the value this run used (read from the run's validated config).

Columns of the CSV: id, method (A, B or both), choice, value (ours, as the paper and current profiles set it),
params_key (a dotted key of params.yaml, empty when no key sets it), reason, seed_says (what the paper says, or
"the seed is silent"). Written to `reports/pages/assumptions.html`, linked from the front page.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd
from jinja2 import Environment, select_autoescape

from biasaudit.pipeline.io import atomic_write_text
from biasaudit.report.html import ASSUMPTIONS_PAGE, HEAD, PAGES, STYLE, assumptions_line

ASSUMPTIONS_CSV = Path("data/reference/assumptions.csv")

COLUMNS = ("id", "method", "choice", "value", "params_key", "reason", "seed_says")
NO_KEY = "(no params key)"
MAX_SHOWN = 400  # characters of a run value shown on the page (a mapping such as vlms: is long)


def load_assumptions(path: Path = ASSUMPTIONS_CSV) -> pd.DataFrame:
    """The assumptions table, strings as written; checks its columns, unique ids and a reason on every row."""
    df = pd.read_csv(Path(path), dtype=str, keep_default_na=False)
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"{path}: lacks column(s) {', '.join(missing)}")
    if df["id"].duplicated().any():
        raise ValueError(f"{path}: duplicate ids {sorted(df.loc[df['id'].duplicated(), 'id'])}")
    if (df["reason"].str.strip() == "").any():
        raise ValueError(f"{path}: rows without a reason: {list(df.loc[df['reason'].str.strip() == '', 'id'])}")
    return df


def lookup(config: Mapping[str, Any], key: str) -> Any:
    """The value of a dotted key in a nested mapping (the run's `Params.model_dump()`); KeyError when absent."""
    value: Any = config
    for part in key.split("."):
        if not isinstance(value, Mapping) or part not in value:
            raise KeyError(key)
        value = value[part]
    return value


def shown(value: Any) -> str:
    """A run value as one line of text: a mapping of models by its names, others as compact JSON."""
    if isinstance(value, str):
        text = value
    elif isinstance(value, Mapping) and value and all(isinstance(v, Mapping) for v in value.values()):
        text = ", ".join(map(str, value))  # models:, vlms: → their names
    else:
        text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= MAX_SHOWN else text[: MAX_SHOWN - 1] + "…"


def run_values(table: pd.DataFrame, config: Mapping[str, Any], readings: Mapping[str, str] | None = None) -> list[str]:
    """This run's value of each row's params key ('' for a row without one); for a reading row (an id of
    `readings`, from report/replication.py alternative_readings) the run's value under the reading taken and
    under the alternative."""
    out = []
    readings = readings or {}
    for rid, key in zip(table["id"], table["params_key"]):
        if rid in readings:
            out.append(shown(readings[rid]))
            continue
        if not key:
            out.append("")
            continue
        try:
            out.append(shown(lookup(config, key)))
        except KeyError:
            out.append(f"not in this run's params: {key}")
    return out


PAGE = """<h1>Our assumptions: the choices the papers leave open</h1><p><a href="index.html">← front page</a></p>
<p class="note">{{ rows|length }} choices this project makes where the papers fix nothing, each with the value we use
(paper and current profiles), the params.yaml key that sets it, this run's value of that key (profile
<b>{{ profile }}</b>), the reason, and what the paper says. Source: <code>{{ source }}</code>.</p>
<div class="scroll"><table class="t"><tr><th>id</th><th>choice</th><th>our value</th><th>params key</th>
<th>this run</th><th>reason</th><th>the paper says</th></tr>
{% for r in rows %}<tr id="{{ r.id }}"><td>{{ r.id }}<br><small>{{ r.method }}</small></td><td>{{ r.choice }}</td>
<td><small>{{ r.value }}</small></td><td>{% if r.params_key %}<code>{{ r.params_key }}</code>{% else %}<small>{{ no_key }}</small>{% endif %}</td>
<td><small>{{ r.this_run }}</small></td><td><small>{{ r.reason }}</small></td><td><small>{{ r.seed_says }}</small></td></tr>{% endfor %}</table></div>
<p class="trail">made by <code>biasaudit.report.assumptions.build_assumptions</code></p>
</body></html>
"""


def write_assumptions(reports: Path, table: pd.DataFrame, config: Mapping[str, Any], profile: str,
                      stand_ins: list[str] | tuple[str, ...] = (), title: str = "biasaudit report",
                      source: Path = ASSUMPTIONS_CSV, readings: Mapping[str, str] | None = None,
                      skipped: list[str] | tuple[str, ...] = ()) -> Path:
    """Write `<reports>/pages/assumptions.html` (one row per assumption with this run's value; the banner lists
    `skipped`, Params.skipped: the measurements this run switched off); return its path."""
    rows = table.assign(this_run=run_values(table, config, readings)).to_dict("records")
    env = Environment(autoescape=select_autoescape(default=True, default_for_string=True))
    text = env.from_string(HEAD + PAGE).render(
        title=f"Assumptions · {title}", base="../", profile=profile, stand_in=bool(stand_ins), style=STYLE,
        stand_ins="; ".join(stand_ins), skipped="; ".join(skipped), rows=rows, no_key=NO_KEY, source=Path(source).as_posix())
    return atomic_write_text(Path(reports) / PAGES / ASSUMPTIONS_PAGE, text)


def build_assumptions(reports: Path, config: Mapping[str, Any], profile: str, stand_ins: list[str] | tuple[str, ...] = (),
                      path: Path = ASSUMPTIONS_CSV, root: Path = Path("."),
                      title: str = "biasaudit report", readings: Mapping[str, str] | None = None,
                      skipped: list[str] | tuple[str, ...] = ()) -> pd.DataFrame:
    """Read the assumptions table, write its page with this run's values (`config`: `Params.model_dump()`;
    `readings`: id → the run's value under the reading taken and the alternative), and return the table with a
    `this_run` column."""
    table = load_assumptions(Path(root) / path)
    write_assumptions(Path(reports), table, config, profile, stand_ins, title, path, readings, skipped)
    return table.assign(this_run=run_values(table, config, readings))


__all__ = ["ASSUMPTIONS_CSV", "ASSUMPTIONS_PAGE", "COLUMNS", "assumptions_line", "build_assumptions",
           "load_assumptions", "lookup", "run_values", "shown", "write_assumptions"]
