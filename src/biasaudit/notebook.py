"""The first cell of every stage notebook: validated parameters, seeds and a stand-in banner."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import numpy as np

from biasaudit.config import PARAMS_FILE, ParamsError, load_params
from biasaudit.params import Params


def repo_root(start: str | Path = ".") -> Path | None:
    """The nearest folder at or above `start` that holds both dvc.yaml and params.yaml (the project's
    root, where `dvc repro` runs every stage), or None."""
    here = Path(start).resolve()
    for folder in (here, *here.parents):
        if (folder / "dvc.yaml").is_file() and (folder / PARAMS_FILE).is_file():
            return folder
    return None


def enter_repo_root() -> Path | None:
    """Make the working directory the project's root when it is below it (JupyterLab starts a
    notebook's kernel in `notebooks/`; `dvc repro` runs it from the root), so every relative path
    (params.yaml, data/, reports/) names what it names under `dvc repro`. Returns the new root, or
    None when nothing changed (already at the root, or outside any project)."""
    root = repo_root()
    if root is None or root == Path.cwd().resolve():
        return None
    os.chdir(root)
    return root


def stage_params(section: str, params_file: str | Path = PARAMS_FILE) -> tuple[Params, Any]:
    """The first cell of every stage notebook: load and validate params.yaml — the only source of
    parameter values — and seed the global RNGs. Returns (all params, the stage's section).

    Notebooks take no values from papermill except what varies per stage instance (the foreach key:
    `model`, `vlm`), and a notebook opened from `notebooks/` (JupyterLab) first moves to the project's
    root, so a notebook run by hand reads exactly what `dvc repro` reads and writes where it writes."""
    if not Path(params_file).is_absolute() and not Path(params_file).is_file():
        moved = enter_repo_root()
        if moved is not None:
            print(f"working directory: {moved} (the project's root, as under dvc repro)")
    cfg = load_params(params_file)
    if section not in Params.model_fields:
        raise ParamsError(f"unknown params section '{section}'; known: {', '.join(Params.model_fields)}")
    random.seed(cfg.seed)
    np.random.seed(cfg.seed % 2**32)
    return cfg, getattr(cfg, section)


def banner(cfg: Params) -> None:
    """Print which profile produced this notebook, and the stand-in banner whenever a stand-in ran. Tables show
    every column (no `...`): the notebook's HTML scrolls a wide table inside its box."""
    import html

    import pandas as pd
    from IPython.display import HTML, display

    pd.set_option("display.max_columns", None)

    fakes = cfg.stand_ins()
    if fakes:  # the one rule, whatever the profile: a run is real only when nothing in it is a stand-in
        display(HTML("<div style='border:3px solid #b00;padding:8px;font-size:1.3em;color:#b00'>"
                     f"<b>STAND-IN RUN</b> (profile {html.escape(cfg.profile)}): planted, simulated or "
                     "random-weight parts ran, so the numbers below test the pipeline and describe no real "
                     f"model. Stand-ins: {html.escape('; '.join(fakes))}.</div>"))
    else:
        display(HTML(f"<div style='padding:6px;border:1px solid #555'>Profile: <b>{cfg.profile}</b></div>"))
    skipped = cfg.skipped()
    if skipped:  # measurements switched off (Params.skipped): said wherever the banner is
        display(HTML("<div style='padding:6px;border:1px solid #555'>Skipped measurements (switched off by "
                     f"this run's parameters): {html.escape('; '.join(skipped))}.</div>"))


def show(result: Any, writer: Any, rows: int = 30) -> None:
    """Display an analysis section (biasaudit.pipeline.outputs.Result) in the notebook, then write its files with
    `writer` (an OutputWriter): its title and status, notes, the head of each table, each figure. None (a
    section that does not apply to this input) shows and writes nothing."""
    from IPython.display import Markdown, display

    from biasaudit.pipeline.io import display_table

    if result is None:
        return

    display(Markdown(f"### {result.title} — *{result.status}*" + (f": {result.reason}" if result.reason else "")))
    for note in result.notes:
        print("note:", note)
    for name, table in result.tables.items():
        print(name)
        display(display_table(table.head(rows)))  # the notebook's text: the writer's precision first, as in its .md
    for fig in result.figures.values():
        display(fig.fig)
    writer.add(result)
