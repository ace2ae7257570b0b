"""The first cell of every stage notebook: validated parameters, seeds and a stand-in banner."""

from __future__ import annotations

import random
from typing import Any

import numpy as np

from biasaudit.config import ParamsError, load_params, validate
from biasaudit.params import Params


def stage_params(section: str, params_file: str = "params.yaml", **passed: Any) -> tuple[Params, Any]:
    """Load and validate params.yaml, with the values papermill passed (from dvc.yaml) replacing
    those of `section`; seed the global RNGs. Returns (all params, the section)."""
    cfg = load_params(params_file)
    if passed:
        if section not in Params.model_fields:
            raise ParamsError(f"unknown params section '{section}'")
        raw = cfg.model_dump()
        unknown = set(passed) - set(raw[section])
        if unknown:
            raise ParamsError(f"{section}: the notebook passed unknown keys {sorted(unknown)}; "
                              f"allowed: {', '.join(sorted(raw[section]))}")
        raw[section].update(passed)
        cfg = validate(raw)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed % 2**32)
    return cfg, getattr(cfg, section)


def banner(cfg: Params) -> None:
    """Print which profile produced this notebook; the offline profile runs stand-in models."""
    from IPython.display import HTML, display

    if cfg.profile == "offline":
        display(HTML("<div style='border:3px solid #b00;padding:8px;font-size:1.3em;color:#b00'>"
                     "<b>STAND-IN RUN</b> (offline profile): PLANTED-truth images (recoloured packaged photos "
                     "with declared labels and skin tones), a SIMULATED classifier, random-weight models "
                     "elsewhere, a handful of prompts. The numbers below test the pipeline against known "
                     "values; they describe no real model.</div>"))
    else:
        display(HTML(f"<div style='padding:6px;border:1px solid #555'>Profile: <b>{cfg.profile}</b></div>"))
